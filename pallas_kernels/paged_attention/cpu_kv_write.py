"""The write of a step's K/V into the pool on the CPU as a native, in-place XLA FFI call (cpu_kv_write.cc).

For bfloat16 pools, which XLA:CPU cannot scatter into without converting the whole pool to float32 and back.
Same contract as the jnp scatter in jaxllm/model/kv_cache.py's `write_kv`, tested against it.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from pallas_kernels.native_build import CpuTarget

WRITE = CpuTarget(Path(__file__).with_name("cpu_kv_write.cc"), "JaxllmWriteKV", "jaxllm_write_kv")


def cpu_write_kv(
    k_pool: jax.Array,  # [L, N, Hkv, B, D]
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar
    slot_mapping: jax.Array,  # [T] int32
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
) -> tuple[jax.Array, jax.Array]:
    """The pools with token t's K/V at slot slot_mapping[t], written in place."""
    WRITE.register()
    results = (jax.ShapeDtypeStruct(k_pool.shape, k_pool.dtype), jax.ShapeDtypeStruct(v_pool.shape, v_pool.dtype))
    call = jax.ffi.ffi_call(WRITE.name, results, input_output_aliases={0: 0, 1: 1})
    return call(k_pool, v_pool, jnp.asarray(layer, jnp.int32), slot_mapping.astype(jnp.int32),
                k.astype(k_pool.dtype), v.astype(v_pool.dtype))


def cpu_write_kv_error() -> str | None:
    """Why the native write cannot run here (no compiler, a build error), or None when it can; asked once."""
    return WRITE.error
