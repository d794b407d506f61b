"""Stateless building blocks of a decoder layer: RMSNorm, rotary embeddings, the gated MLP, linear, soft-cap."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.model import weights
from jaxllm.model.kernels import REFERENCE, Kernels
from jaxllm.rope_scaling import default_inv_freq
from pallas_kernels.add_rms_norm.reference import rms_norm  # noqa: F401 (the model's norm, re-exported)
from pallas_kernels.silu_and_mul.cpu import silu_and_mul_cpu
from pallas_kernels.silu_and_mul.reference import gated_activation_reference


def linear(x: jax.Array, w: Any, b: jax.Array | None = None, kernels: Kernels = REFERENCE,
           live_rows: jax.Array | None = None) -> jax.Array:
    """x [..., K] @ w[N, K].T (+ b [N]) -> [..., N] in x.dtype, accumulated in float32. `w` is any weight format
    (weights.py: a dense array, or a WeightFormat that does its own dot); the layers never look at it. live_rows
    (an int32 scalar, None: all rows): x's rows from it on are a bucket's padding, which the dot may skip."""
    rounded = None if b is not None else weights.rounded_dot(x, w, kernels, live_rows)  # rounded as it is stored
    return rounded if rounded is not None else linear_sums(x, w, b, kernels, live_rows).astype(x.dtype)


def linear_sums(x: jax.Array, w: Any, b: jax.Array | None = None, kernels: Kernels = REFERENCE,
                live_rows: jax.Array | None = None) -> jax.Array:
    """`linear`'s float32 sums [..., N], before their rounding to x.dtype."""
    y = weights.dot(x, w, kernels, live_rows)
    return y if b is None else y + b.astype(jnp.float32)


# The fewest rows the native SiLU kernel takes: below, its call costs more than XLA's fused op saves (batch-1 decode
# 15% slower with it; 64 rows the same; a 512-token prefill step 6% faster: benchmarks/RESULTS.md).
SILU_KERNEL_MIN_ROWS = 128


def gated_mlp(x: jax.Array, w_gate_up: Any, w_down: Any, kernels: Kernels = REFERENCE,
              activation: str = "silu", live_rows: jax.Array | None = None) -> jax.Array:
    """down(act(gate(x)) * up(x)) [T, H] in x.dtype: `gated_mlp_sums` rounded."""
    return gated_mlp_sums(x, w_gate_up, w_down, kernels, activation, live_rows).astype(x.dtype)


def gated_mlp_sums(x: jax.Array, w_gate_up: Any, w_down: Any, kernels: Kernels = REFERENCE,
                   activation: str = "silu", live_rows: jax.Array | None = None) -> jax.Array:
    """down(act(gate(x)) * up(x)) as the down projection's float32 sums [T, H]: SwiGLU (silu) or GeGLU (gelu_tanh);
    x [T, H], w_gate_up [2F, H] (gate rows, then up rows), w_down [H, F]. In a 16-bit dtype the activation and the
    product each round once, computed in float32 (as torch's kernels do): jnp ops on 16-bit arrays would round after
    every primitive of the activation, which costs a conversion pair each on CPU and drifts further from the
    checkpoint's own arithmetic. live_rows: `linear`'s."""
    hidden = weights.fused_silu_and_mul(x, w_gate_up, kernels, live_rows) if activation == "silu" else None  # [T, F]
    if hidden is None:  # the activation apart from the projection
        hidden = _gated_activation(weights.dot(x, w_gate_up, kernels, live_rows), x.dtype, activation, kernels)
    return linear_sums(hidden, w_down, kernels=kernels, live_rows=live_rows)  # [T, H] float32


def _gated_activation(gate_up: jax.Array, dtype, activation: str, kernels: Kernels) -> jax.Array:
    """act(gate) * up [T, F] in dtype from the gate|up projection's float32 sums [T, 2F]."""
    if (kernels.silu_and_mul == "cpu" and activation == "silu" and dtype == jnp.bfloat16
            and math.prod(gate_up.shape[:-1]) >= SILU_KERNEL_MIN_ROWS):
        return silu_and_mul_cpu(gate_up)  # the reference's roundings, exp at a tenth of XLA:CPU's cost
    return gated_activation_reference(gate_up.astype(dtype), activation)


def swiglu(x: jax.Array, w_gate_up: Any, w_down: Any, kernels: Kernels = REFERENCE) -> jax.Array:
    return gated_mlp(x, w_gate_up, w_down, kernels)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap) (None: x as it is)."""
    return x if cap is None else cap * jnp.tanh(x / cap)


def rope_inv_freq(config: ModelConfig, local: bool = False) -> tuple[np.ndarray, float]:
    """([D/2] float32 inverse frequencies, the cos/sin factor), host-side and static: the global layers' table
    with config.rope_scaling (rope_scaling.py), or with local the sliding layers' (base rope_local_theta, no
    scaling; Gemma 3)."""
    if local:
        return default_inv_freq(config.rope_local_theta or config.rope_theta, config.head_dim), 1.0
    if config.rope_scaling is None:
        return default_inv_freq(config.rope_theta, config.head_dim), 1.0
    inv_freq, factor = config.rope_scaling.inv_freq(config.rope_theta, config.head_dim)
    return np.asarray(inv_freq, np.float32), float(factor)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray | tuple[np.ndarray, float], dtype
                 ) -> tuple[jax.Array, jax.Array]:
    """positions [T] -> cos, sin [T, D] in `dtype` (half-split layout: both halves share a frequency), each times
    the scaling's factor when inv_freq comes with one (rope_inv_freq)."""
    inv_freq, factor = inv_freq if isinstance(inv_freq, tuple) else (inv_freq, 1.0)
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]  # [T, D/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)  # [T, D]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.astype(dtype), sin.astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [T, H, D] rotated by position; rotate_half pairs element i with i + D/2."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
