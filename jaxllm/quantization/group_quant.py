"""Asymmetric 4-bit group quantization (AutoAWQ's rule), in jnp so the searches run it under jit.

Weights stay in the Hugging Face layout w [N, K]; a group is G consecutive inputs of one output row, i.e. one
(row, K/G) cell here and one (K/G, column) cell of the transposed checkpoint tensors (awq_format.py):

    scale = max(max - min, 1e-5) / 15          rounded to fp16 first: the checkpoint stores it so, and codes
    zero  = clamp(round(-min / scale), 0, 15)  computed against the stored scale dequantize as written
    q     = clamp(round(w / scale) + zero, 0, 15)
    w    ~= (q - zero) * scale
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAX_CODE = 15
MIN_RANGE = 1e-5  # a constant group still gets a usable scale


def _groups(w: jax.Array, group_size: int) -> jax.Array:
    n, k = w.shape
    return w.reshape(n, k // group_size, group_size)  # [N, K/G, G]


def quantize_groups(w: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """w [N, K] -> (codes int32 [N, K], zero points int32 [N, K/G], scales float32 [N, K/G], fp16-exact)."""
    g = _groups(w.astype(jnp.float32), group_size)  # [N, K/G, G]
    w_max, w_min = g.max(axis=-1), g.min(axis=-1)  # [N, K/G]
    scale = jnp.maximum(w_max - w_min, MIN_RANGE) / MAX_CODE
    scale = scale.astype(jnp.float16).astype(jnp.float32)
    zero = jnp.clip(jnp.round(-w_min / scale), 0, MAX_CODE)
    q = jnp.clip(jnp.round(g / scale[..., None]) + zero[..., None], 0, MAX_CODE)  # [N, K/G, G]
    return q.reshape(w.shape).astype(jnp.int32), zero.astype(jnp.int32), scale


def dequantize_groups(q: jax.Array, zero: jax.Array, scale: jax.Array, group_size: int) -> jax.Array:
    """Codes [N, K], zero points and scales [N, K/G] -> w [N, K] float32."""
    g = _groups(q, group_size).astype(jnp.float32)  # [N, K/G, G]
    return ((g - zero[..., None].astype(jnp.float32)) * scale[..., None]).reshape(q.shape)


def fake_quantize(w: jax.Array, group_size: int) -> jax.Array:
    """w [N, K] rounded to what its checkpoint would dequantize to (float32)."""
    return dequantize_groups(*quantize_groups(w, group_size), group_size)


def clip_groups(w: jax.Array, max_val: jax.Array, group_size: int) -> jax.Array:
    """w [N, K] clamped to [-max_val, max_val] per group (max_val [N, K/G]): outliers given up for a finer grid."""
    g = _groups(w, group_size)
    return jnp.clip(g, -max_val[..., None], max_val[..., None]).reshape(w.shape)
