"""Ragged paged attention on the CPU as a native XLA FFI call (cpu_kernel.cc), the CPU twin of the Pallas kernels.

The jnp reference gathers a copy of every key block it reads; this kernel reads the blocks where they lie in the
pool, one (sequence, KV head, query tile) at a time on XLA's CPU threads. Same contract and arguments as
`ragged_paged_attention_reference` (sliding_window and logit_softcap included), tested against it. The library is
built at first use (pallas_kernels/native_build.py); `cpu_kernel_error()` says why it cannot be on this machine
(None when it can).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.native_build import CpuTarget, load_native_library
from pallas_kernels.paged_attention.reference import check_attention_options

KERNEL = CpuTarget(Path(__file__).with_name("cpu_kernel.cc"), "JaxllmRaggedPagedAttention",
                   "jaxllm_ragged_paged_attention")


def cpu_ragged_paged_attention(
    q: jax.Array,  # [T, Hq, D]
    k_pool: jax.Array,  # [L, N, Hkv, B, D] float32 or bfloat16
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar
    block_tables: jax.Array,  # [S, MB] int32
    context_lens: jax.Array,  # [S] int32, 0 for padded sequences
    query_start_loc: jax.Array,  # [S+1] int32
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
) -> jax.Array:  # [T, Hq, D] in q.dtype; padding tokens get zeros
    check_attention_options(sliding_window, logit_softcap)
    KERNEL.register()
    # bfloat16 queries get their result in bfloat16 from the kernel (rounded there, as astype rounds): no separate
    # conversion op after the call
    out_dtype = jnp.bfloat16 if q.dtype == jnp.bfloat16 else jnp.float32
    call = jax.ffi.ffi_call(KERNEL.name, jax.ShapeDtypeStruct(q.shape, out_dtype))
    out = call(q.astype(jnp.float32), k_pool, v_pool, jnp.asarray(layer, jnp.int32),
               block_tables.astype(jnp.int32), context_lens.astype(jnp.int32), query_start_loc.astype(jnp.int32),
               sm_scale=np.float32(sm_scale), sliding_window=np.int64(sliding_window or 0),
               logit_softcap=np.float32(logit_softcap or 0.0))  # 0: off
    return out.astype(q.dtype)


def cpu_kernel_error() -> str | None:
    """Why the native kernel cannot run here (no compiler, a build error), or None when it can; asked once."""
    return KERNEL.error


def prompt_tiles_on_amx() -> bool:
    """Whether prompt chunks over a bfloat16 pool attend on AMX tiles here (the build has AMX-BF16 and the operating
    system grants the tile state); elsewhere they take the AVX-512 lanes path."""
    return cpu_kernel_error() is None and bool(load_native_library(KERNEL.source).JaxllmAttentionOnAmx())
