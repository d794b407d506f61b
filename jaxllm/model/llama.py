"""The Llama-family forward on one device: one pure function over (params, kv_cache, batch), layer after layer.

tensor_parallel.py runs it over the device mesh (one device unless the model is split), under shard_map: that is
the only way the library calls it.

One forward for every family (Llama 2/3/3.1, SmolLM, Mistral, Qwen2/2.5/3, Gemma 2/3, Phi-3, and the
mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE, whose sparse layers run model/moe.py's MLP): what differs is
read from config.arch (architecture.py: norm style, sandwich norms, activation, embedding scale, q/k norms) and
per layer from the config (sliding window, rope table). A layer's static kind is (its window, its rope table):
the layer function is traced once per distinct kind (one for most models, two for Gemma's local / global layers),
however deep the model. Activations stay in the params' dtype; norms, softmax and logits are computed in float32.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxllm.config import ModelConfig
from jaxllm.model.attention import attend
from jaxllm.model import weights
from jaxllm.model.kernels import REFERENCE, Kernels
from jaxllm.model.kv_cache import KVCache, write_kv
from jaxllm.model.layers import (apply_rope, gated_mlp_sums, linear, linear_sums, rms_norm, rope_cos_sin,
                                 rope_inv_freq, soft_cap)
from jaxllm.model.moe import moe_mlp
from jaxllm.model.params import LayerParams, LlamaParams
from jaxllm.model.step_batch import StepBatch
from pallas_kernels.add_rms_norm.cpu import add_rms_norm_cpu
from pallas_kernels.add_rms_norm.reference import add_rms_norm_reference


def device_forward_hidden(
    params: LlamaParams,
    kv_cache: KVCache,
    batch: StepBatch,
    *,
    config: ModelConfig,
    kernels: Kernels,
    reduce: Callable[[jax.Array], jax.Array],
    first_expert: jax.Array | int = 0,
) -> tuple[jax.Array, KVCache]:
    """Returns (final-normed hidden states [R, H] at batch.logits_indices, kv_cache with this step's K/V written).

    params and kv_cache are one device's share (its heads and MLP columns) and config describes that share;
    `reduce` sums the partial outputs of the row-parallel projections (wo, w_down) over the devices. `kernels`
    names the implementation of attention, the KV write and the weight formats' matmuls (kernels.py).
    `first_expert`: the global id of this device's first expert (expert parallelism; 0 otherwise).
    """
    x = weights.embedding_rows(params.embed, batch.token_ids)  # [T, H]
    if config.arch.embed_scale:  # Gemma: times sqrt(H), the factor rounded to the activations' dtype as HF does
        x = x * jnp.asarray(math.sqrt(config.hidden_size), x.dtype)
    kinds = [layer_kind(config, i) for i in range(config.num_layers)]
    tables = {kind.local_rope: rope_cos_sin(batch.positions, rope_inv_freq(config, kind.local_rope), x.dtype)
              for kind in set(kinds)}  # local_rope -> (cos, sin) [T, D] each
    k_pool, v_pool = kv_cache.k, kv_cache.v  # [L, N, Hkv, B, D] each

    # A Python loop over the layers' own arrays: the program reads each weight where it lies (a scan over [L, ...]
    # stacks would copy every layer's weights out of them at every step). The layer is one jitted function called
    # L times, so it is traced and lowered once per distinct static kind (XLA inlines the calls): 7x less tracing
    # than an inline loop body.
    layer_step = jax.jit(functools.partial(_layer, config=config, kernels=kernels, reduce=reduce),
                         static_argnames=("kind",))
    # each layer hands its MLP's output to the next one unadded, which adds it and norms the sum in one step
    pending = jnp.zeros(x.shape, _output_dtype(config, kernels, x.dtype))  # [T, H]
    for layer, (lp, kind) in enumerate(zip(params.layers, kinds)):
        cos, sin = tables[kind.local_rope]
        x, pending, k_pool, v_pool = layer_step(x, pending, k_pool, v_pool, lp, jnp.int32(layer), cos, sin, batch,
                                                first_expert, kind=kind)

    rows = batch.logits_indices
    _, hidden = _add_and_norm(x[rows], pending[rows], params.final_norm, config, kernels)  # [R, H]
    return hidden, KVCache(k=k_pool, v=v_pool)


class LayerKind(NamedTuple):
    """What a layer's program depends on besides its weights (static: one trace per distinct kind)."""
    sliding_window: int | None  # None: attends to the whole context
    local_rope: bool  # the sliding layers' own rope table (Gemma 3's rope_local_theta)


def layer_kind(config: ModelConfig, layer: int) -> LayerKind:
    sliding = config.is_sliding(layer)
    return LayerKind(config.sliding_window if sliding else None,
                     sliding and config.rope_local_theta is not None)


def _layer(x, pending, k_pool, v_pool, lp: LayerParams, layer, cos, sin, batch: StepBatch, first_expert, *,
           kind: LayerKind, config: ModelConfig, kernels: Kernels, reduce: Callable[[jax.Array], jax.Array]):
    """One decoder layer: x [T, H] and the previous layer's output not yet added to it (pending [T, H]) -> x with
    it added, this layer's output (not added), this step's K/V written into the pools' layer `layer`. The rows past
    the step's tokens (the bucket's padding) may be skipped by the linears' dots (weights.py's live_rows)."""
    live_rows = batch.query_start_loc[-1]  # the step's tokens: rows from here on are padding
    x, h = _add_and_norm(x, pending, lp.attn_norm, config, kernels)
    q, k, v = _qkv(h, lp, config, kernels, live_rows)  # [T, Hq, D], [T, Hkv, D], [T, Hkv, D]
    if lp.q_norm is not None:  # per head, before rope (Qwen3, Gemma 3)
        q, k = _norm(q, lp.q_norm, config), _norm(k, lp.k_norm, config)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_pool, v_pool = write_kv(k_pool, v_pool, layer, batch.slot_mapping, k, v, kernels)
    attn = attend(kernels, q, k_pool, v_pool, layer, batch, config.attention_scale,
                  sliding_window=kind.sliding_window, logit_softcap=config.attn_logit_softcap)  # [T, Hq, D]
    attn_out = linear_sums(attn.reshape(x.shape[0], -1), lp.wo, kernels=kernels, live_rows=live_rows)  # [T, H]
    x, h = _add_and_norm(x, _output(attn_out, lp.post_attn_norm, x.dtype, config, kernels, reduce), lp.mlp_norm,
                         config, kernels)
    if lp.router is not None:  # a mixture-of-experts layer: its output in x.dtype, widened exactly where fused
        mlp = reduce(moe_mlp(h, lp, config, kernels, first_expert)).astype(_output_dtype(config, kernels, x.dtype))
    else:
        mlp = _output(gated_mlp_sums(h, lp.w_gate_up, lp.w_down, kernels, config.arch.activation, live_rows),
                      lp.post_mlp_norm, x.dtype, config, kernels, reduce)
    return x, mlp, k_pool, v_pool


def _fused_add_norm(config: ModelConfig, kernels: Kernels, dtype) -> bool:
    """Whether the residual adds and the norms after them run as one native call (Kernels.add_rms_norm, on one
    device: tensor_parallel.layer_kernels): a bfloat16 model whose norm casts back before its scale and that has no
    norm between a sublayer and its residual add (Llama's; not Gemma's). The sublayers then hand over their float32
    sums, which the kernel rounds as `linear` would."""
    return (kernels.add_rms_norm == "cpu" and dtype == jnp.bfloat16 and not config.arch.norm_offset
            and not config.arch.sandwich_norms)


def _output_dtype(config: ModelConfig, kernels: Kernels, dtype):
    """The dtype of a sublayer's output as the residual add takes it."""
    return jnp.float32 if _fused_add_norm(config, kernels, dtype) else dtype


def _output(sums: jax.Array, post_norm: jax.Array | None, dtype, config: ModelConfig, kernels: Kernels,
            reduce: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """A sublayer's projection sums [T, H] float32 -> its output as the residual add takes it: the sums themselves
    where the add is fused, else rounded to the activations' dtype, reduced over the devices and (Gemma) normed."""
    if _fused_add_norm(config, kernels, dtype):
        return sums
    return _post_norm(reduce(sums.astype(dtype)), post_norm, config)


def _add_and_norm(x: jax.Array, output: jax.Array, weight: jax.Array, config: ModelConfig, kernels: Kernels
                  ) -> tuple[jax.Array, jax.Array]:
    """x [T, H] + a sublayer's output (`_output`) -> (the sum [T, H] in x.dtype, its norm by `weight` [T, H])."""
    if _fused_add_norm(config, kernels, x.dtype):
        return add_rms_norm_cpu(x, output, weight, config.rms_norm_eps)
    return add_rms_norm_reference(x, output, weight, config.rms_norm_eps, config.arch.norm_offset)


def _norm(x: jax.Array, weight: jax.Array, config: ModelConfig) -> jax.Array:
    return rms_norm(x, weight, config.rms_norm_eps, config.arch.norm_offset)


def _post_norm(x: jax.Array, weight: jax.Array | None, config: ModelConfig) -> jax.Array:
    """Gemma's norm of a sublayer's output before the residual add (x itself in the other families)."""
    return x if weight is None else _norm(x, weight, config)


def compute_logits(params: LlamaParams, hidden: jax.Array, vocab_size: int | None = None,
                   softcap: float | None = None, kernels: Kernels = REFERENCE) -> jax.Array:
    """Final-normed hidden states [R, H] -> logits [R, V] float32, through the (tied or untied) LM head; the first
    vocab_size columns when the head is padded (tensor_parallel.py pads it to a multiple of the devices); softcap
    (config.final_logit_softcap, Gemma 2): logits -> c * tanh(logits / c). `kernels` picks the head's dot (weights.dot):
    the plain dot unless the head lies whole on one device."""
    lm_head = params.embed if params.lm_head is None else params.lm_head  # [V, H]
    logits = weights.dot(hidden, lm_head, kernels)  # [R, V] float32
    logits = logits if vocab_size is None or vocab_size == logits.shape[1] else logits[:, :vocab_size]
    return soft_cap(logits, softcap)


def _qkv(h: jax.Array, lp: LayerParams, config: ModelConfig, kernels: Kernels, live_rows: jax.Array):
    t, d = h.shape[0], config.head_dim
    qkv = linear(h, lp.w_qkv, lp.b_qkv, kernels, live_rows)  # [T, (Hq + 2*Hkv)*D]
    q, k, v = jnp.split(qkv, [config.num_heads * d, (config.num_heads + config.num_kv_heads) * d], axis=-1)
    return q.reshape(t, -1, d), k.reshape(t, -1, d), v.reshape(t, -1, d)
