"""The Pallas Triton-backend names the kernels use, kept in one place because that backend's API keeps moving.

A `pallas_call` lowers through Triton on NVIDIA GPUs only when it is given Triton compiler params; without them it
lowers to Mosaic GPU, which these kernels do not target. Both supported jax lines (0.10.x and 0.11.x) name the class
`jax.experimental.pallas.triton.CompilerParams` (it was `TritonCompilerParams` before jax 0.7); jax 0.11 deprecates
the Triton backend with a DeprecationWarning at lowering time but keeps it working. `load` and `store` are the
masked memory accesses (a masked-off lane is never dereferenced on the GPU).
"""

from __future__ import annotations

from jax.experimental.pallas import triton as _triton

load = _triton.load
store = _triton.store


def compiler_params(num_warps: int, num_stages: int):
    """Triton compiler params: `num_warps` x 32 threads per program, `num_stages` software-pipelined loads."""
    return _triton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
