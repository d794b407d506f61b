"""Bytes a decode step must read from device memory at the least: the roofline of a memory-bound step.

A decode step reads every weight once (whatever the batch), the K/V of every sequence's context, and one row of
the embedding table per token: with an untied LM head the table is not otherwise read, so it does not count; a tied
one is the LM head and counts whole. Activations, the K/V the step writes and the logits are a few MB against
the weights' GB and are left out, so achieved bandwidth = these bytes / step time is a lower bound of what the step
moved, and bytes / peak bandwidth the fastest the step could run.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.model.params import LlamaParams


def decode_step_bytes(params: LlamaParams, config: ModelConfig, batch_size: int, context: int,
                      kv_dtype) -> dict[str, int]:
    """{"weights", "kv", "total"}: bytes of the params one step reads (any weight format: its leaves' bytes) and
    of the K and V of batch_size sequences of `context` cached tokens each."""
    leaves = jax.tree_util.tree_leaves(params)
    weights = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)
    if params.lm_head is not None:  # untied: only the tokens' rows of the embedding table are read
        embed = params.embed
        weights += batch_size * embed.shape[1] * embed.dtype.itemsize - embed.size * embed.dtype.itemsize
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * np.dtype(kv_dtype).itemsize
    kv = batch_size * context * per_token
    return {"weights": int(weights), "kv": int(kv), "total": int(weights + kv)}
