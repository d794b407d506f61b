"""Bytes a decode step must read from device memory: the roofline of a memory-bound step.

A decode step reads every weight once (whatever the batch), the K/V of every sequence's context, and one row of
the embedding table per token: with an untied LM head the table is not otherwise read, so it does not count; a tied
one is the LM head and counts whole. Activations, the K/V the step writes and the logits are a few MB against
the weights' GB and are left out, so achieved bandwidth = these bytes / step time is a lower bound of what the step
moved, and bytes / peak bandwidth the fastest the step could run.

A MoE layer's [E, ...] expert stacks are read only for the experts the step's tokens route to. Assumed: the
batch_size * k routes fall on distinct experts until every expert is taken, min(E, batch_size * k) experts per
sparse layer (routing spread out, as a load-balanced router aims for; under uniform random routing the expected
count is E * (1 - (1 - k/E) ** batch_size), fewer at mid batch sizes). So for a MoE model the figure is the most
a step's routes can read, not the least every step must: with routes on fewer experts a step reads less. Its
router and shared expert are read whole.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.model.params import LayerParams, LlamaParams

EXPERT_STACKS = ("w_experts_gate_up", "w_experts_down")  # LayerParams' [E, ...] fields


def experts_read(config: ModelConfig, batch_size: int) -> int:
    """Distinct experts a sparse layer reads for batch_size tokens, under the module docstring's assumption."""
    return min(config.num_experts, batch_size * config.num_experts_per_tok)


def decode_step_bytes(params: LlamaParams, config: ModelConfig, batch_size: int, context: int,
                      kv_dtype) -> dict[str, int]:
    """{"weights", "kv", "total"}: bytes of the params one step reads (any weight format: its leaves' bytes; of a
    MoE layer's expert stacks the experts_read share) and of the K and V of batch_size sequences of `context`
    cached tokens each."""
    weights = _tree_bytes(params) - sum(_unread_expert_bytes(layer, config, batch_size) for layer in params.layers)
    if params.lm_head is not None:  # untied: only the tokens' rows of the embedding table are read
        embed = params.embed
        weights += batch_size * embed.shape[1] * embed.dtype.itemsize - embed.size * embed.dtype.itemsize
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * np.dtype(kv_dtype).itemsize
    kv = batch_size * context * per_token
    return {"weights": int(weights), "kv": int(kv), "total": int(weights + kv)}


def _tree_bytes(tree) -> int:
    return sum(leaf.size * np.dtype(leaf.dtype).itemsize for leaf in jax.tree_util.tree_leaves(tree))


def _unread_expert_bytes(layer: LayerParams, config: ModelConfig, batch_size: int) -> int:
    """Bytes of the layer's expert stacks that belong to experts the step does not read (0 in a dense layer)."""
    stacks = [getattr(layer, name) for name in EXPERT_STACKS if getattr(layer, name) is not None]
    unread = config.num_experts - experts_read(config, batch_size) if stacks else 0
    return sum(_tree_bytes(stack) // config.num_experts * unread for stack in stacks)
