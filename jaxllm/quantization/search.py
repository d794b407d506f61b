"""AWQ's searches (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization") over a linear group's weights,
judged on the group's calibration inputs through their Gram matrix.

For a group reading inputs X [M, K] (M calibration tokens), the output error of any weight change dW [N, K] is

    || X dW^T ||^2 = sum_{n} dW[n] (X^T X) dW[n]^T = sum((dW @ Gram) * dW),     Gram = X^T X  [K, K]

so once the Gram matrix is accumulated, every candidate scale or clip costs O(N K^2), whatever M is: the
calibration set can be as long as wanted, and it is processed in chunks of sequences without keeping any
activations. mean |x| per input channel [K] is AWQ's salience statistic.

Scales: input channels that carry large activations matter most; multiplying their weight columns by s > 1 before
quantizing (and dividing the input by s, folded into the op that produces it) gives them a relatively finer grid.
The scale comes from the activation statistic alone, s = mean|x| ** alpha, normalized so that
sqrt(max(s) * min(s)) = 1; alpha is picked from a grid in [0, 1) by the output error of the whole group:

    err(alpha) = || X W^T - (X / s) Q(W * s)^T ||^2 = || X dW^T ||^2,   dW = W - Q(W * s) / s

alpha = 0 gives s = 1, plain round-to-nearest, so the search can only improve on RTN's error. The linears of a
group (q, k, v; gate, up) share the input and so the scale: their rows are concatenated.

Clipping: after scaling, every (output row, group) of a weight gets a clamp value max_val = ratio * max|w| for the
ratio in {1, 1 - 1/n_grid, ..., 1 - max_shrink} that minimizes that group's own contribution to the output error,

    err[n, g] = dw[n, g] . Gram_gg . dw[n, g]^T,      Gram_gg the [G, G] diagonal block of the inputs' Gram matrix

(AutoAWQ's criterion, which ignores the cross-group terms; it evaluates it on 512 sampled tokens, the Gram
blocks cover all calibration tokens): outliers are given up when that costs less than the coarser grid. Each
candidate costs O(N K G).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxllm.config import ModelConfig
from jaxllm.quantization.dense_forward import layer_forward
from jaxllm.quantization.group_quant import clip_groups, fake_quantize

MIN_SCALE = 1e-4


class TapStats(NamedTuple):
    gram: jax.Array  # [K, K] X^T X / M
    mean_abs: jax.Array  # [K] mean |x| per input channel


@functools.partial(jax.jit, static_argnames="config")
def _layer_moments(w: dict, x: jax.Array, config: ModelConfig) -> dict:
    """Per tap: (X^T X [K, K], sum |x| [K]) over the chunk x [B, T, H]."""
    _, taps = layer_forward(w, x, config)
    moments = {}
    for name, tap in taps.items():
        x2 = tap.reshape(-1, tap.shape[-1]).astype(jnp.float32)  # [B*T, K]
        gram = jax.lax.dot_general(x2, x2, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        moments[name] = (gram, jnp.abs(x2).sum(axis=0))
    return moments


def layer_tap_stats(w: dict, chunks: list[jax.Array], config: ModelConfig) -> dict[str, TapStats]:
    """The float layer `w` run on every calibration chunk [B, T, H]: TapStats of each tap (dense_forward.TAPS)."""
    total, tokens = None, 0
    for x in chunks:
        moments = _layer_moments(w, x, config)
        total = moments if total is None else jax.tree_util.tree_map(jnp.add, total, moments)
        tokens += x.shape[0] * x.shape[1]
    return {name: TapStats(gram / tokens, abs_sum / tokens) for name, (gram, abs_sum) in total.items()}


def output_error(dw: jax.Array, gram: jax.Array) -> jax.Array:
    """Mean squared output change per token of the weight change dw [N, K] on inputs with this Gram matrix."""
    return jnp.sum((dw @ gram) * dw)


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


def diagonal_blocks(gram: jax.Array, group_size: int) -> jax.Array:
    """Gram [K, K] -> its K/G diagonal blocks [K/G, G, G]."""
    groups = gram.shape[0] // group_size
    blocks = gram.reshape(groups, group_size, groups, group_size)  # [K/G, G, K/G, G]
    index = jnp.arange(groups)
    return blocks[index, :, index, :]


@functools.partial(jax.jit, static_argnames=("group_size", "n_grid", "max_shrink"))
def search_clip(w: jax.Array, gram: jax.Array, group_size: int, n_grid: int = 20,
                max_shrink: float = 0.5) -> jax.Array:
    """w [N, K] (already scaled) and its inputs' Gram [K, K] -> the best clamp value per group [N, K/G]."""
    n, k = w.shape
    blocks = diagonal_blocks(gram, group_size)  # [K/G, G, G]
    wg = w.reshape(n, k // group_size, group_size)  # [N, K/G, G]
    org_max = jnp.abs(wg).max(axis=-1)  # [N, K/G]
    ratios = 1.0 - jnp.arange(int(max_shrink * n_grid), dtype=jnp.float32) / n_grid

    def group_errors(ratio):
        max_val = org_max * ratio
        dw = (w - fake_quantize(clip_groups(w, max_val, group_size), group_size)).reshape(wg.shape)
        return jnp.einsum("ngi,gij,ngj->ng", dw, blocks, dw)  # [N, K/G]

    errors = jax.lax.map(group_errors, ratios)  # [R, N, K/G]
    return org_max * ratios[jnp.argmin(errors, axis=0)]
