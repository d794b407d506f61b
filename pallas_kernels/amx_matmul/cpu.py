"""The tiled matmul on Intel AMX as one native XLA FFI call (cpu_kernel.cc): bfloat16 x [..., K] times a weight
stored as AMX tiles (reference.py's `pack_tiles`). Same contract as reference.py's `tiled_dot`, tested against it.
The library is built at first use (pallas_kernels/native_build.py); `amx_matmul_error()` says why it cannot run on
this machine (None when it can).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_kernels.native_build import CpuTarget, NativeBuildError, load_native_library

KERNEL = CpuTarget(Path(__file__).with_name("cpu_kernel.cc"), "JaxllmTiledMatmul", "jaxllm_tiled_matmul")


def tiled_matmul_cpu(x: jax.Array, tiles: jax.Array) -> jax.Array:
    """x [..., K] bfloat16 @ w.T -> [..., N] float32 for tiles [N/32, K/32, 2, 16, 32] bfloat16 of w [N, K]."""
    bf16 = jnp.dtype(jnp.bfloat16)
    if (x.dtype != bf16 or tiles.dtype != bf16 or tiles.ndim != 5 or tiles.shape[2:] != (2, 16, 32)
            or x.shape[-1] != tiles.shape[1] * 32 or math.prod(x.shape[:-1]) < 1):
        raise ValueError(f"the AMX kernel takes bfloat16 x [..., K] and tiles [N/32, K/32, 2, 16, 32]; got x "
                         f"{x.dtype}{list(x.shape)}, tiles {tiles.dtype}{list(tiles.shape)}")
    KERNEL.register()
    rows = x.reshape(-1, x.shape[-1])  # [M, K]
    n = tiles.shape[0] * 32
    out = jax.ffi.ffi_call(KERNEL.name, jax.ShapeDtypeStruct((rows.shape[0], n), jnp.float32))(rows, tiles)
    return out.reshape(*x.shape[:-1], n)  # [..., N]


@functools.cache
def amx_matmul_error() -> str | None:
    """Why the kernel cannot run here (no AMX-BF16 on this CPU, tile state not granted, a build error), or None."""
    if KERNEL.error is not None:
        return KERNEL.error
    try:
        ready = load_native_library(KERNEL.source).JaxllmAmxReady()
    except (NativeBuildError, AttributeError) as error:
        return str(error)
    return None if ready else "this CPU has no AMX-BF16, or the operating system does not grant its tile state"
