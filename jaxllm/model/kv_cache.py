"""The preallocated KV block pool and the write of a step's new keys and values into it.

Layout, all layers in one pair of arrays (the attention kernels take the whole pool and a layer index, so a layer's
part is never copied out):

    k, v: [L, N, Hkv, B, D]      N blocks of B tokens; slot = block * B + offset
    block 0 is the null block: padding tokens write there, block tables pad with it, nothing reads it as context.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxllm.config import ModelConfig
from jaxllm.model.kernels import REFERENCE, Kernels
from pallas_kernels.paged_attention.cpu_kv_write import cpu_write_kv

NULL_BLOCK = 0


@struct.dataclass
class KVCache:
    k: jax.Array  # [L, N, Hkv, B, D]
    v: jax.Array  # [L, N, Hkv, B, D]


def kv_cache_bytes(config: ModelConfig, num_blocks: int, block_size: int, dtype) -> int:
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * jnp.dtype(dtype).itemsize
    return per_token * num_blocks * block_size


def write_kv(
    k_pool: jax.Array,  # [L, N, Hkv, B, D]
    v_pool: jax.Array,  # [L, N, Hkv, B, D]
    layer: jax.Array | int,  # scalar
    slot_mapping: jax.Array,  # [T] int32
    k: jax.Array,  # [T, Hkv, D]
    v: jax.Array,  # [T, Hkv, D]
    kernels: Kernels = REFERENCE,
) -> tuple[jax.Array, jax.Array]:
    """Scatter each token's K/V to its slot (in place when the pool is a donated or loop-carried buffer), with the
    native write where `kernels` chose it and the pool is bfloat16: XLA:CPU has no bfloat16 scatter (it converts the
    whole pool to float32 and back around one, in every layer of every step: seconds per step)."""
    if kernels.kv_write == "cpu" and jnp.dtype(k_pool.dtype) == jnp.bfloat16:
        return cpu_write_kv(k_pool, v_pool, layer, slot_mapping, k, v)
    block_size = k_pool.shape[3]
    block, offset = slot_mapping // block_size, slot_mapping % block_size
    k_pool = k_pool.at[layer, block, :, offset].set(k.astype(k_pool.dtype))
    v_pool = v_pool.at[layer, block, :, offset].set(v.astype(v_pool.dtype))
    return k_pool, v_pool

