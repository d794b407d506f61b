"""The Llama-family forward on one device: one pure function over (params, kv_cache, batch), layer after layer.

tensor_parallel.py runs it over the device mesh (one device unless the model is split), under shard_map: that is
the only way the library calls it.

Covers Llama 2/3/3.1, SmolLM/SmolLM2, Mistral (no sliding window) and Qwen2/2.5 (q/k/v bias), GQA, tied or
untied embeddings. Activations stay in the params' dtype; norms, softmax and logits are computed in float32.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from jaxllm.config import ModelConfig
from jaxllm.model.attention import attend
from jaxllm.model.kernels import Kernels
from jaxllm.model.kv_cache import KVCache, write_kv
from jaxllm.model.layers import apply_rope, linear, rms_norm, rope_cos_sin, rope_inv_freq, swiglu
from jaxllm.model.params import LayerParams, LlamaParams
from jaxllm.model.step_batch import StepBatch


def device_forward_hidden(
    params: LlamaParams,
    kv_cache: KVCache,
    batch: StepBatch,
    *,
    config: ModelConfig,
    kernels: Kernels,
    reduce: Callable[[jax.Array], jax.Array],
) -> tuple[jax.Array, KVCache]:
    """Returns (final-normed hidden states [R, H] at batch.logits_indices, kv_cache with this step's K/V written).

    params and kv_cache are one device's share (its heads and MLP columns) and config describes that share;
    `reduce` sums the partial outputs of the row-parallel projections (wo, w_down) over the devices. `kernels`
    names the implementation of attention, the KV write and the weight formats' matmuls (kernels.py).
    """
    x = params.embed[batch.token_ids]  # [T, H]
    cos, sin = rope_cos_sin(batch.positions, rope_inv_freq(config), x.dtype)  # [T, D] each
    k_pool, v_pool = kv_cache.k, kv_cache.v  # [L, N, Hkv, B, D] each

    # A Python loop over the layers' own arrays: the program reads each weight where it lies (a scan over [L, ...]
    # stacks would copy every layer's weights out of them at every step). The layer is one jitted function called
    # L times, so it is traced and lowered once (XLA inlines the calls): 7x less tracing than an inline loop body.
    layer_step = jax.jit(functools.partial(_layer, config=config, kernels=kernels, reduce=reduce))
    for layer, lp in enumerate(params.layers):
        x, k_pool, v_pool = layer_step(x, k_pool, v_pool, lp, jnp.int32(layer), cos, sin, batch)

    hidden = rms_norm(x[batch.logits_indices], params.final_norm, config.rms_norm_eps)  # [R, H]
    return hidden, KVCache(k=k_pool, v=v_pool)


def _layer(x, k_pool, v_pool, lp: LayerParams, layer, cos, sin, batch: StepBatch, *, config: ModelConfig,
           kernels: Kernels, reduce: Callable[[jax.Array], jax.Array]):
    """One decoder layer: x [T, H] -> x [T, H], this step's K/V written into the pools' layer `layer`."""
    h = rms_norm(x, lp.attn_norm, config.rms_norm_eps)
    q, k, v = _qkv(h, lp, config, kernels)  # [T, Hq, D], [T, Hkv, D], [T, Hkv, D]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_pool, v_pool = write_kv(k_pool, v_pool, layer, batch.slot_mapping, k, v, kernels)
    attn = attend(kernels, q, k_pool, v_pool, layer, batch, config.head_dim ** -0.5)  # [T, Hq, D]
    x = x + reduce(linear(attn.reshape(x.shape[0], -1), lp.wo, kernels=kernels))
    h = rms_norm(x, lp.mlp_norm, config.rms_norm_eps)
    x = x + reduce(swiglu(h, lp.w_gate_up, lp.w_down, kernels))
    return x, k_pool, v_pool


def compute_logits(params: LlamaParams, hidden: jax.Array, vocab_size: int | None = None) -> jax.Array:
    """Final-normed hidden states [R, H] -> logits [R, V] float32, through the (tied or untied) LM head; the first
    vocab_size columns when the head is padded (tensor_parallel.py pads it to a multiple of the devices)."""
    lm_head = params.embed if params.lm_head is None else params.lm_head  # [V, H]
    logits = jax.lax.dot_general(hidden, lm_head, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return logits if vocab_size is None or vocab_size == logits.shape[1] else logits[:, :vocab_size]


def _qkv(h: jax.Array, lp: LayerParams, config: ModelConfig, kernels: Kernels):
    t, d = h.shape[0], config.head_dim
    qkv = linear(h, lp.w_qkv, lp.b_qkv, kernels)  # [T, (Hq + 2*Hkv)*D]
    q, k, v = jnp.split(qkv, [config.num_heads * d, (config.num_heads + config.num_kv_heads) * d], axis=-1)
    return q.reshape(t, -1, d), k.reshape(t, -1, d), v.reshape(t, -1, d)
