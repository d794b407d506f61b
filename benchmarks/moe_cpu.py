"""The routed MoE experts step on CPU against a dense gated MLP of the same active width, jitted.

    python benchmarks/moe_cpu.py [--experts 8 32 64] [--tokens 1 8 64 256] [--hidden 1024] [--inter 1024]
                                 [--top-k 2] [--repeats 7] [--dtype float32]

For each E: random weights [E, 2I, H] / [E, H, I] and, per T, a uniform top-k routing (k distinct experts per
token, as a router's top-k of random logits gives). The dense MLP has intermediate k*I (the active width of one
token). Times are medians of interleaved rounds (all see the same machine state), so the ratios to dense are the
figures to read. Routed implementations side by side: `jnp` (cpu.py's fori_loop over the used experts) and `native`
(cpu_kernel.cc, experts read in place); the jnp reference
(every expert on every token) runs beside them (--no-reference skips it). Also printed: the distinct experts
the step touches, and `weight bytes` = touched / k, the expert weight bytes the step must read over the dense MLP's
(a decode step on a CPU is bound by weight reads, so no routed implementation gets below that ratio there).
Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_kernels.moe import moe_experts_cpu, moe_experts_reference  # noqa: E402
from pallas_kernels.moe.cpu_native import moe_experts_native  # noqa: E402
from pallas_kernels.moe.cpu import expert_mlp  # noqa: E402


def dense_mlp(x, w_gate_up, w_down):
    """The dense gated MLP: x [T, H], w_gate_up [2kI, H], w_down [H, kI] -> [T, H]."""
    return expert_mlp(x, w_gate_up, w_down, "silu")


def median_ms(fns: dict, args: dict, repeats: int) -> dict:
    """Interleaved rounds of every fn on its args; the median milliseconds of each."""
    for name, fn in fns.items():
        jax.block_until_ready(fn(*args[name]))  # compile
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args[name]))
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def run(experts: int, tokens: int, hidden: int, inter: int, top_k: int, weights, dense, repeats: int,
        reference: bool) -> dict:
    rng = np.random.default_rng(tokens)
    x = jnp.asarray(rng.standard_normal((tokens, hidden), np.float32)).astype(weights[0].dtype)  # [T, H]
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])  # [T, k]
    route_weights = jnp.asarray(rng.random((tokens, top_k), np.float32))  # [T, k]
    fns = {"jnp": jax.jit(lambda *a: moe_experts_cpu(*a, native=False)), "native": jax.jit(moe_experts_native),
           "dense": jax.jit(dense_mlp)}
    if reference:
        fns["reference"] = jax.jit(moe_experts_reference)
    moe_args = (x, jnp.asarray(ids, jnp.int32), route_weights, *weights)
    ms = median_ms(fns, {name: (x, *dense) if name == "dense" else moe_args for name in fns}, repeats)
    touched = len(np.unique(ids))
    row = dict(experts=experts, tokens=tokens, touched=touched, weight_bytes_ratio=touched / top_k)
    for name, value in ms.items():
        row[f"{name}_ms"] = value
        row[f"{name}_ratio"] = value / ms["dense"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inter", type=int, default=1024)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-reference", dest="reference", action="store_false")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    h, i, k = args.hidden, args.inter, args.top_k
    key = jax.random.PRNGKey(0)
    dtype = jnp.dtype(args.dtype)
    dense = (jax.random.normal(key, (2 * k * i, h), dtype) / h ** 0.5,
             jax.random.normal(key, (h, k * i), dtype) / (k * i) ** 0.5)
    rows = []
    print(f"H={h} I={i} top-{k} {dtype}; dense MLP intermediate {k * i}; median ms of {args.repeats} rounds")
    names = ["jnp", "native"] + (["reference"] if args.reference else [])
    print(f"{'E':>4} {'T':>5} {'dense ms':>9} " + " ".join(f"{n + ' ms':>12} {'/dense':>6}" for n in names) +
          f" {'touched':>8} {'weight bytes':>12}")
    for experts in args.experts:
        weights = (jax.random.normal(key, (experts, 2 * i, h), dtype) / h ** 0.5,
                   jax.random.normal(key, (experts, h, i), dtype) / i ** 0.5)
        for tokens in args.tokens:
            row = run(experts, tokens, h, i, k, weights, dense, args.repeats, args.reference)
            rows.append(row)
            print(f"{experts:>4} {tokens:>5} {row['dense_ms']:>9.2f} " +
                  " ".join(f"{row[n + '_ms']:>12.2f} {row[n + '_ratio']:>6.2f}" for n in names) +
                  f" {row['touched']:>8} {row['weight_bytes_ratio']:>12.1f}", flush=True)
        del weights
    print(json.dumps({"hidden": h, "inter": i, "top_k": k, "dtype": str(dtype), "rows": rows}))


if __name__ == "__main__":
    main()
