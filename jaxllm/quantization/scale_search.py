"""AWQ's per-input-channel scale search (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization").

Input channels that carry large activations matter most; multiplying their weight columns by s > 1 before
quantizing (and dividing the input by s, folded into the op that produces it) gives them a relatively finer grid.
The scale comes from the activation statistic alone, s = mean|x| ** alpha, normalized so that
sqrt(max(s) * min(s)) = 1; alpha is picked from a grid in [0, 1) by the output error of the whole group on the
calibration inputs:

    err(alpha) = || X W^T - (X / s) Q(W * s)^T ||^2 = || X dW^T ||^2,   dW = W - Q(W * s) / s

evaluated through the Gram matrix (activation_stats.py). alpha = 0 gives s = 1, plain round-to-nearest, so the
search can only improve on RTN's error. The linears of a group (q, k, v; gate, up) share the input and so the
scale: their rows are concatenated.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxllm.quantization.activation_stats import output_error
from jaxllm.quantization.group_quant import fake_quantize

MIN_SCALE = 1e-4


def scales_for(mean_abs: jax.Array, alpha: jax.Array) -> jax.Array:
    """[K] channel scales mean|x| ** alpha, centred so that max * min = 1."""
    s = jnp.maximum(mean_abs ** alpha, MIN_SCALE)
    return s / jnp.sqrt(s.max() * s.min())


def scaled_error(w: jax.Array, gram: jax.Array, s: jax.Array, group_size: int) -> jax.Array:
    """Output error of quantizing w [N, K] with channel scales s [K] (inputs divided by s)."""
    return output_error(w - fake_quantize(w * s, group_size) / s, gram)


@functools.partial(jax.jit, static_argnames=("group_size", "n_grid"))
def search_scales(w: jax.Array, gram: jax.Array, mean_abs: jax.Array, group_size: int,
                  n_grid: int = 20) -> tuple[jax.Array, jax.Array, jax.Array]:
    """w [N, K] (the group's rows), its inputs' Gram [K, K] and mean |x| [K] -> (best scales [K], best alpha,
    errors [n_grid] for alpha = 0, 1/n_grid, ...)."""
    alphas = jnp.arange(n_grid, dtype=jnp.float32) / n_grid
    errors = jax.lax.map(lambda a: scaled_error(w, gram, scales_for(mean_abs, a), group_size), alphas)
    best = alphas[jnp.argmin(errors)]
    return scales_for(mean_abs, best), best, errors
