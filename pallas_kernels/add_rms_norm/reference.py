"""The contract of a decoder layer's RMS norm and of the residual add before it, as the model computes them in jnp.

rms_norm: x [..., H], weight [H] -> [..., H] in x's dtype, normalised over the last axis in float32.
add_rms_norm_reference: x [T, H] (the residual stream), delta [T, H] (a sublayer's output in any float dtype:
rounded to x's dtype first, as the projection's output is), weight [H] -> (x + delta rounded once, its rms_norm).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
    """Normalise over the last axis in float32. offset 0 (Llama): cast back, then scale by weight; offset 1
    (Gemma): scale by (1 + weight) in float32, then cast back (each the order its Hugging Face model uses)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if offset:
        return (x32 * (offset + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * x32.astype(x.dtype)


def add_rms_norm_reference(x: jax.Array, delta: jax.Array, weight: jax.Array, eps: float, offset: float = 0.0
                           ) -> tuple[jax.Array, jax.Array]:
    total = x + delta.astype(x.dtype)  # [T, H]
    return total, rms_norm(total, weight, eps, offset)
