"""The tiled matmul on Intel AMX (else AVX512-BF16) as one native XLA FFI call (cpu_kernel.cc): bfloat16 x [..., K]
times a weight stored as AMX tiles (reference.py's `pack_tiles`). Same contract as reference.py's `tiled_dot`,
tested against it; and a gate|up projection with the gated MLP's SiLU and product in its epilogue
(`tiled_silu_matmul_cpu`). The library is built at first use (pallas_kernels/native_build.py); `amx_matmul_error()`
says why it cannot run on this machine (None when it can).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_kernels.native_build import CpuTarget, NativeBuildError, load_native_library

_SOURCE = Path(__file__).with_name("cpu_kernel.cc")
KERNEL = CpuTarget(_SOURCE, "JaxllmTiledMatmul", "jaxllm_tiled_matmul")
ROUNDED_KERNEL = CpuTarget(_SOURCE, "JaxllmTiledMatmulBf16", "jaxllm_tiled_matmul_bf16")
SILU_KERNEL = CpuTarget(_SOURCE, "JaxllmTiledSiluMatmul", "jaxllm_tiled_silu_matmul")


def tiled_matmul_cpu(x: jax.Array, tiles: jax.Array, live_rows: jax.Array | None = None,
                     dtype=jnp.float32) -> jax.Array:
    """x [..., K] bfloat16 @ w.T -> [..., N] float32 for tiles [N/32, K/32, 2, 16, 32] bfloat16 of w [N, K]; with
    dtype bfloat16, those float32 sums rounded to bfloat16 as they are stored (bit for bit their astype, with no
    pass of XLA's over them).

    live_rows (an int32 scalar, None: all): x's rows (flattened) from live_rows on are padding, not computed; the
    result's rows there are zeros."""
    _check_operands(x, tiles)
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"the tiled matmul writes float32 sums or bfloat16; got dtype {dtype}")
    target = KERNEL if dtype == jnp.float32 else ROUNDED_KERNEL
    return _call(target, x, tiles.shape[0] * 32, dtype, tiles, live_rows)  # [..., N]


def tiled_silu_matmul_cpu(x: jax.Array, tiles: jax.Array, live_rows: jax.Array | None = None) -> jax.Array:
    """silu(gate) * up [..., F] bfloat16 for x [..., K] bfloat16 and the tiles [2F/32, K/32, 2, 16, 32] of a gate|up
    weight [2F, K] (gate rows, then up rows; F a multiple of 32): the gated MLP's activation on the projection's
    float32 sums, rounded as silu_and_mul/reference.py's on those sums rounded to bfloat16, in one call. live_rows as
    tiled_matmul_cpu's."""
    _check_operands(x, tiles)
    if tiles.shape[0] % 2:
        raise ValueError(f"the fused SiLU takes the tiles of a gate|up weight [2F, K] with F a multiple of 32; got "
                         f"tiles {list(tiles.shape)} ({tiles.shape[0] * 32} rows)")
    return _call(SILU_KERNEL, x, tiles.shape[0] // 2 * 32, jnp.bfloat16, tiles, live_rows)  # [..., F]


def _check_operands(x: jax.Array, tiles: jax.Array) -> None:
    bf16 = jnp.dtype(jnp.bfloat16)
    if (x.dtype != bf16 or tiles.dtype != bf16 or tiles.ndim != 5 or tiles.shape[2:] != (2, 16, 32)
            or x.shape[-1] != tiles.shape[1] * 32 or math.prod(x.shape[:-1]) < 1):
        raise ValueError(f"the AMX kernel takes bfloat16 x [..., K] and tiles [N/32, K/32, 2, 16, 32]; got x "
                         f"{x.dtype}{list(x.shape)}, tiles {tiles.dtype}{list(tiles.shape)}")


def _call(target: CpuTarget, x: jax.Array, n: int, dtype, tiles: jax.Array, live_rows: jax.Array | None
          ) -> jax.Array:
    """The target's [..., n] result in dtype for x [..., K] (its rows flattened for the call)."""
    target.register()
    rows = x.reshape(-1, x.shape[-1])  # [M, K]
    live = jnp.asarray(rows.shape[0] if live_rows is None else live_rows, jnp.int32).reshape(())
    out = jax.ffi.ffi_call(target.name, jax.ShapeDtypeStruct((rows.shape[0], n), dtype))(rows, tiles, live)
    return out.reshape(*x.shape[:-1], n)


@functools.cache
def amx_matmul_error() -> str | None:
    """Why the kernel cannot run here (neither AMX-BF16 nor AVX512-BF16 on this CPU, AMX's tile state not granted,
    a build error), or None. Registers every target: a program kept by the engine's program cache that calls the
    fused one must find it registered when it is loaded, before anything is traced."""
    for target in (KERNEL, ROUNDED_KERNEL, SILU_KERNEL):
        if target.error is not None:
            return target.error
    try:
        ready = load_native_library(KERNEL.source).JaxllmTiledMatmulReady()
    except (NativeBuildError, AttributeError) as error:
        return str(error)
    return None if ready else "this CPU has neither AMX-BF16 nor AVX512-BF16, or the OS does not grant AMX's tile state"
