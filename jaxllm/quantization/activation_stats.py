"""What the searches need to know about a linear group's calibration inputs: their Gram matrix and mean |x|.

For a group reading inputs X [M, K] (M calibration tokens), the output error of any weight change dW [N, K] is

    || X dW^T ||^2 = sum_{n} dW[n] (X^T X) dW[n]^T = sum((dW @ Gram) * dW),     Gram = X^T X  [K, K]

so once the Gram matrix is accumulated, every candidate scale or clip costs O(N K^2), whatever M is: the
calibration set can be as long as wanted, and it is processed in chunks of sequences without keeping any
activations. mean |x| per input channel [K] is AWQ's salience statistic.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxllm.config import ModelConfig
from jaxllm.quantization.dense_forward import layer_forward


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
