"""The skinny matmul on the CPU as one native XLA FFI call (cpu_kernel.cc): x [..., K] with at most MAX_ROWS rows
in all times a dense weight w [N, K] (float32 or bfloat16), or a bfloat16 one stored as AMX tiles [N/32, K/32, 2,
16, 32] (pallas_kernels/amx_matmul's `pack_tiles`), each weight row read once and converted on the fly. Same
contract as reference.py's `dense_dot` (for tiles, amx_matmul's `tiled_dot`), tested against it. The library is
built at first use (pallas_kernels/native_build.py); `skinny_kernel_error()` says why it cannot be on this machine
(None when it can).
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_kernels.amx_matmul.reference import TILE
from pallas_kernels.native_build import CpuTarget

KERNEL = CpuTarget(Path(__file__).with_name("cpu_kernel.cc"), "JaxllmSkinnyMatmul", "jaxllm_skinny_matmul")
MAX_ROWS = 8  # the kernel's bound on x's rows (cpu_kernel.cc's kMaxRows)
X_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
W_DTYPES = X_DTYPES


def skinny_supports(x: jax.Array, w: jax.Array) -> bool:
    """Whether the kernel takes these operands: a dense 2-D w [N, K] or its tiles, at most MAX_ROWS rows of x, the
    dtypes."""
    shape = _dense_shape(w)  # [N, K]
    return (shape is not None and x.shape[-1] == shape[1] and 1 <= math.prod(x.shape[:-1]) <= MAX_ROWS
            and x.dtype in X_DTYPES and w.dtype in W_DTYPES)


def skinny_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., K] @ W [N, K].T -> [..., N] float32 (reference.py's `dense_dot`), on XLA's CPU threads; w is W or
    its tiles [N/32, K/32, 2, 16, 32]."""
    if not skinny_supports(x, w):
        raise ValueError(f"the skinny kernel takes x [..., K] with 1 to {MAX_ROWS} rows (float32 or bfloat16) and "
                         f"w [N, K] (float32 or bfloat16) or bfloat16 tiles [N/32, K/32, 2, 16, 32]; got x "
                         f"{x.dtype}{list(x.shape)}, w {w.dtype}{list(w.shape)}")
    KERNEL.register()
    n = _dense_shape(w)[0]
    rows = x.reshape(-1, x.shape[-1]).astype(jnp.float32)  # [M, K]: bfloat16 -> float32 is exact
    out = jax.ffi.ffi_call(KERNEL.name, jax.ShapeDtypeStruct((rows.shape[0], n), jnp.float32))(rows, w)
    return out.reshape(*x.shape[:-1], n)  # [..., N]


def _dense_shape(w: jax.Array) -> tuple[int, int] | None:
    """[N, K] of the weight w stands for: w's own shape, or that of the tiles [N/32, K/32, 2, 16, 32] of a bfloat16
    weight; None for any other array."""
    if w.ndim == 2:
        return w.shape
    if w.ndim == 5 and w.shape[2:] == (2, TILE // 2, TILE) and w.dtype == jnp.bfloat16:
        return w.shape[0] * TILE, w.shape[1] * TILE
    return None


def skinny_kernel_error() -> str | None:
    """Why the native kernel cannot run here (no compiler, a build error), or None when it can; asked once."""
    return KERNEL.error
