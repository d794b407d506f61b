"""Time jitted functions the same way everywhere: compile once (timed on its own), warm up, then time each run.

    t = time_jitted(jax.jit(f), x, y, name="f", iters=20)   # Timing: compile_s, times_s, XLA's flops and bytes
    c = measure_ceiling()                                   # this machine's matmul flop/s and copy bytes/s
    print(format_table([t.row(c)]))                         # median/p10/p90 ms, spread, achieved rates, utilization

Units: seconds, flops (floating-point operations, a multiply-add counts 2), bytes. Rates are per second.
flops and bytes_accessed are XLA's own estimates from `compiled.cost_analysis()` for the whole program. XLA counts
a while loop's body once, whatever the trip count, and sees nothing inside custom calls (the attention kernels):
for a model step, count FLOPs from the model instead (benchmarks/decode_roofline.py does).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass
class Timing:
    name: str
    compile_s: float  # lowering + XLA compilation, timed on its own
    times_s: list[float]  # wall time of each measured run, dispatch to block_until_ready
    flops: float | None  # per run, from cost_analysis (None: XLA did not report it)
    bytes_accessed: float | None  # per run, from cost_analysis

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def p10_s(self) -> float:
        return float(np.percentile(self.times_s, 10))  # linear interpolation between order statistics

    @property
    def p90_s(self) -> float:
        return float(np.percentile(self.times_s, 90))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative run-to-run noise."""
        return (self.p90_s - self.p10_s) / self.median_s

    @property
    def flops_per_s(self) -> float | None:
        return None if self.flops is None else self.flops / self.median_s

    @property
    def bytes_per_s(self) -> float | None:
        return None if self.bytes_accessed is None else self.bytes_accessed / self.median_s

    def utilization(self, ceiling: Ceiling) -> dict[str, float | None]:
        """Achieved rates as fractions of the machine's measured ceiling (None where the rate is unknown)."""
        flops, nbytes = self.flops_per_s, self.bytes_per_s
        return {"flops_frac": None if flops is None else flops / ceiling.matmul_flops_per_s,
                "bytes_frac": None if nbytes is None else nbytes / ceiling.copy_bytes_per_s}

    def row(self, ceiling: Ceiling | None = None) -> dict[str, Any]:
        """A flat dict for tables and JSON; with a ceiling, utilization columns too."""
        flops, nbytes = self.flops_per_s, self.bytes_per_s
        row = {"name": self.name, "compile_s": self.compile_s, "runs": len(self.times_s),
               "median_ms": self.median_s * 1e3, "p10_ms": self.p10_s * 1e3, "p90_ms": self.p90_s * 1e3,
               "spread": self.spread, "gflop_per_s": None if flops is None else flops / 1e9,
               "gb_per_s": None if nbytes is None else nbytes / 1e9}
        if ceiling is not None:
            row.update(self.utilization(ceiling))
        return row


def _cost(compiled) -> tuple[float | None, float | None]:
    """(flops, bytes accessed) from cost_analysis, which is a dict, a list of dicts (one per program) or None."""
    try:
        analysis = compiled.cost_analysis()
    except (NotImplementedError, RuntimeError):  # backends without a cost model (XlaRuntimeError is a RuntimeError)
        return None, None
    if isinstance(analysis, dict):
        analysis = [analysis]
    analysis = [a for a in analysis or [] if a]

    def total(key: str) -> float | None:
        values = [a[key] for a in analysis if key in a]
        return float(sum(values)) if values else None

    return total("flops"), total("bytes accessed")


def time_jitted(fn: Callable, *args, name: str = "", warmup: int = 2, iters: int = 20,
                min_time_s: float = 0.0) -> Timing:
    """Compile fn(*args) once, run it `warmup` times, then time at least `iters` runs and at least `min_time_s`.

    fn: a function of arrays (jitted here) or a `jax.jit` object. Static arguments must be bound beforehand
    (functools.partial): the compiled executable takes the array arguments only. Functions that donate
    arguments are refused (the first run would delete the inputs the next run needs).
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    if any(getattr(info, "donated", False) for info in jax.tree_util.tree_leaves(compiled.args_info)):
        raise ValueError(f"time_jitted({name or fn!r}): functions with donated arguments are not supported")
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times: list[float] = []
    while len(times) < iters or sum(times) < min_time_s:
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return Timing(name, compile_s, times, *_cost(compiled))


@dataclasses.dataclass
class Ceiling:
    """What this machine achieves on the simplest compute-bound and memory-bound programs."""

    matmul_flops_per_s: float  # [n, n] @ [n, n]: 2 n^3 flops over the median time
    copy_bytes_per_s: float  # y = x + 1 over copy_mib MiB: read + write = 2 * size bytes over the median time
    matmul_n: int
    copy_mib: int


def measure_ceiling(matmul_n: int = 2048, copy_mib: int = 256, dtype=jnp.float32, iters: int = 10) -> Ceiling:
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (matmul_n, matmul_n), dtype)  # [n, n]
    b = jax.random.normal(kb, (matmul_n, matmul_n), dtype)
    matmul = time_jitted(jnp.matmul, a, b, name="matmul", iters=iters)
    x = jnp.zeros(copy_mib * 2**20 // jnp.dtype(dtype).itemsize, dtype)  # [copy_mib MiB / itemsize]
    copy = time_jitted(lambda x: x + 1, x, name="copy", iters=iters)
    return Ceiling(matmul_flops_per_s=2 * matmul_n**3 / matmul.median_s,
                   copy_bytes_per_s=2 * x.nbytes / copy.median_s, matmul_n=matmul_n, copy_mib=copy_mib)


def format_table(rows: list[dict]) -> str:
    """A markdown table: columns in order of first appearance, floats to 4 significant digits, None blank."""
    columns = list(dict.fromkeys(k for row in rows for k in row))

    def cell(value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
