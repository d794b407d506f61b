"""Stateless building blocks of a Llama layer: RMSNorm, rotary embeddings, SwiGLU, linear."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.model import weights
from jaxllm.model.kernels import REFERENCE, Kernels


def linear(x: jax.Array, w: Any, b: jax.Array | None = None, kernels: Kernels = REFERENCE) -> jax.Array:
    """x [..., K] @ w[N, K].T (+ b [N]) -> [..., N] in x.dtype, accumulated in float32. `w` is any weight format
    (weights.py: a dense array, or a WeightFormat that does its own dot); the layers never look at it."""
    y = weights.dot(x, w, kernels)
    if b is not None:
        y = y + b.astype(jnp.float32)
    return y.astype(x.dtype)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Normalise in float32, cast back, then scale (the order Hugging Face Llama uses)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * x32.astype(x.dtype)


def swiglu(x: jax.Array, w_gate_up: Any, w_down: Any, kernels: Kernels = REFERENCE) -> jax.Array:
    """down(silu(gate(x)) * up(x)); x [T, H], w_gate_up [2F, H] (gate rows, then up rows), w_down [H, F]."""
    gate, up = jnp.split(linear(x, w_gate_up, kernels=kernels), 2, axis=-1)  # [T, F] each
    return linear(jax.nn.silu(gate) * up, w_down, kernels=kernels)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """[D/2] float32 inverse frequencies, with Llama 3 scaling applied when configured (host-side, static)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq.astype(np.float32)
    # Wavelengths longer than the original context / low_freq_factor are slowed by `factor`, shorter than
    # context / high_freq_factor kept, and the band between interpolated linearly in context / wavelength.
    wavelen = 2 * math.pi / inv_freq
    old_ctx = scaling.original_max_position_embeddings
    ratio = (old_ctx / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    ratio = np.clip(ratio, 0.0, 1.0)
    scaled = (1 - ratio) * inv_freq / scaling.factor + ratio * inv_freq
    return scaled.astype(np.float32)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray, dtype) -> tuple[jax.Array, jax.Array]:
    """positions [T] -> cos, sin [T, D] in `dtype` (half-split layout: both halves share a frequency)."""
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]  # [T, D/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)  # [T, D]
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [T, H, D] rotated by position; rotate_half pairs element i with i + D/2."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
