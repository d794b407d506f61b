"""Lowering for NVIDIA GPUs on a CPU-only machine, on both supported jax lines.

`jit(f).trace(...).lower(lowering_platforms=("cuda",))` runs the whole lowering (shard_map's manual computation,
the Pallas -> Triton IR lowering of each kernel, the collectives) without a GPU; only XLA's GPU compile needs one
(or the deviceless compile of tests/gpu_compile). From jax 0.11 Pallas' Triton lowering asks which GPU it lowers
for (its compute capability) and finds only CPU devices here, also inside a shard_map over a mesh of CPU devices,
where an abstract GPU device cannot be named (the context mesh must equal shard_map's). jax's Triton backend keeps
a table of device kinds it knows beyond the built-in ones; listing the CPU device kind there as an H200 makes the
lowering target sm_90, as jax 0.10 does by default.
"""

from __future__ import annotations

import functools
import re

try:  # jax >= 0.11
    from jax._src.pallas.triton import gpu_info as _gpu_info
except ImportError:  # jax 0.10: the lowering assumes compute capability 9.0 when it finds no GPU
    _gpu_info = None

def lower_for_cuda(jitted, *args, **static) -> str:
    """The StableHLO text of `jitted` lowered for CUDA, its Pallas kernels for an H200."""
    if _gpu_info is not None and hasattr(_gpu_info, "registry"):
        _gpu_info.registry.setdefault(
            "cpu", lambda: _gpu_info.get_gpu_info_from_version(_gpu_info.GpuVersion.H200))
    return jitted.trace(*args, **static).lower(lowering_platforms=("cuda",)).as_text()



def count_per_step(lowered_text: str, needle: str) -> int:
    """How many times one run of the module's main function executes an op whose text contains `needle` (e.g. a
    Triton kernel's custom call): a function called from several places (the forward's layer, traced once and
    called once per layer) counts once per call."""
    bodies: dict[str, str] = {}
    for chunk in re.split(r"(?=^\s*func\.func )", lowered_text, flags=re.M)[1:]:
        bodies[re.search(r"@([\w$.\-]+)\(", chunk).group(1)] = chunk

    @functools.cache
    def total(name: str) -> int:
        body = bodies[name]
        return body.count(needle) + sum(total(callee) for callee in re.findall(r"\bcall @([\w$.\-]+)\(", body))

    return total("main")
