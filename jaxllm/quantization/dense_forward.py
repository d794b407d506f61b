"""A plain forward over whole sequences, one layer at a time: calibration activations and perplexity.

The engine's forward (model/llama.py) runs all layers in one program over a paged KV pool; quantization needs the
opposite: each layer alone, on a batch of complete sequences, with the inputs of its linears exposed ("taps"), so
that layer i can be quantized on what the already-quantized layers 0 .. i-1 feed it. No KV cache: dense causal
attention over [B, T] tokens. The blocks (rms_norm, rope, linear) are the model's own.

Layer weights are a dict of float32 arrays named as params.checkpoint_layer_shapes names them (attn_norm, wq, wk,
wv, wo, optional bq/bk/bv, mlp_norm, w_gate, w_up, w_down), each in the HF [out, in] layout: split_layers undoes
the fused LlamaParams layers (model/params.py), since quantization scales and quantizes each checkpoint linear on
its own (q, k, v, gate and up are separate tensors in an AWQ checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.model.layers import apply_rope, linear, rms_norm, rope_cos_sin, rope_inv_freq
from jaxllm.model.params import FUSED_FIELDS, LlamaParams, checkpoint_layer_shapes

# tap name -> the linears that read it (one AWQ scaling group each; "o" is scaled only for MHA, see awq_layer.py)
TAPS = {"qkv": ("wq", "wk", "wv"), "o": ("wo",), "gate_up": ("w_gate", "w_up"), "down": ("w_down",)}


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> jax.Array:
    """q [B, T, Hq, D], k and v [B, T, Hkv, D] -> [B, T, Hq*D]; query head i reads KV head i // (Hq/Hkv)."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    q = q.reshape(b, t, hkv, hq // hkv, d)  # [B, T, Hkv, R, D]
    s = jnp.einsum("bqhrd,bkhd->bhrqk", q, k, preferred_element_type=jnp.float32) * scale  # [B, Hkv, R, T, T]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    p = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
    ctx = jnp.einsum("bhrqk,bkhd->bqhrd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return ctx.reshape(b, t, hq * d).astype(q.dtype)


def layer_forward(w: dict, x: jax.Array, config: ModelConfig) -> tuple[jax.Array, dict]:
    """x [B, T, H] -> (the layer's output [B, T, H], taps: the input of each linear group, see TAPS)."""
    b, t, _ = x.shape
    d = config.head_dim
    cos, sin = rope_cos_sin(jnp.arange(t), rope_inv_freq(config), x.dtype)  # [T, D] each
    h = rms_norm(x, w["attn_norm"], config.rms_norm_eps)  # [B, T, H]
    q = linear(h, w["wq"], w.get("bq")).reshape(b, t, -1, d)  # [B, T, Hq, D]
    k = linear(h, w["wk"], w.get("bk")).reshape(b, t, -1, d)  # [B, T, Hkv, D]
    v = linear(h, w["wv"], w.get("bv")).reshape(b, t, -1, d)
    ctx = causal_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, d ** -0.5)  # [B, T, Hq*D]
    x = x + linear(ctx, w["wo"])
    h2 = rms_norm(x, w["mlp_norm"], config.rms_norm_eps)
    act = jax.nn.silu(linear(h2, w["w_gate"])) * linear(h2, w["w_up"])  # [B, T, F]
    x = x + linear(act, w["w_down"])
    return x, {"qkv": h, "o": ctx, "gate_up": h2, "down": act}


@functools.partial(jax.jit, static_argnames="config")
def layer_output(w: dict, x: jax.Array, config: ModelConfig) -> jax.Array:
    """x [B, T, H] -> the layer's output [B, T, H] (the taps are computed on the way but never materialized)."""
    return layer_forward(w, x, config)[0]


@jax.jit
def embed_tokens(embed: jax.Array, tokens: jax.Array) -> jax.Array:
    """tokens [B, T] -> x [B, T, H] float32."""
    return embed[tokens].astype(jnp.float32)


@functools.partial(jax.jit, static_argnames="eps")
def next_token_nll(final_norm: jax.Array, lm_head: jax.Array, x: jax.Array, tokens: jax.Array,
                   eps: float) -> jax.Array:
    """Final hidden states x [B, T, H] and the tokens [B, T] -> [B, T-1] negative log-likelihood of each next
    token (position t predicts token t + 1)."""
    h = rms_norm(x[:, :-1], final_norm, eps)
    logits = jnp.einsum("bth,vh->btv", h, lm_head, preferred_element_type=jnp.float32)  # [B, T-1, V]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


def split_layers(params: LlamaParams, config: ModelConfig) -> list[dict[str, np.ndarray]]:
    """Host float32 weights of every layer, q/k/v and gate/up apart."""
    return [_split_layer(layer, config) for layer in params.layers]


def _split_layer(layer, config: ModelConfig) -> dict[str, np.ndarray]:
    shapes = checkpoint_layer_shapes(config)
    out = {}
    for field in (f.name for f in dataclasses.fields(layer)):
        value = getattr(layer, field)
        if value is None:
            continue
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise ValueError(f"layer weight {field!r} is already in a packed format ({type(value).__name__}); "
                             f"quantize a model with dense weights")
        out[field] = np.asarray(value, dtype=np.float32)
    for fused, parts in FUSED_FIELDS.items():
        if fused in out:
            cuts = np.cumsum([shapes[p][0] for p in parts])[:-1]
            out.update(zip(parts, np.split(out.pop(fused), cuts, axis=0)))
    return out


def global_weights(params: LlamaParams) -> dict[str, np.ndarray]:
    """embed [V, H], final_norm [H] and, when untied, lm_head [V, H], as host float32."""
    out = {"embed": params.embed, "final_norm": params.final_norm}
    if params.lm_head is not None:
        out["lm_head"] = params.lm_head
    return {name: np.asarray(value, dtype=np.float32) for name, value in out.items()}
