"""AWQ's clipping search: shrink each group's range when the outliers it gives up cost less than the coarser grid.

After scaling, every (output row, group) of a weight gets a clamp value max_val = ratio * max|w| for the ratio in
{1, 1 - 1/n_grid, ..., 1 - max_shrink} that minimizes that group's own contribution to the output error,

    err[n, g] = dw[n, g] . Gram_gg . dw[n, g]^T,      Gram_gg the [G, G] diagonal block of the inputs' Gram matrix

(AutoAWQ's criterion, which ignores the cross-group terms; it evaluates it on 512 sampled tokens, the Gram
blocks cover all calibration tokens). Each candidate costs O(N K G).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxllm.quantization.group_quant import clip_groups, fake_quantize


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
