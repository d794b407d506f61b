"""The mixture-of-experts MLP of a sparse layer: a router picks each token's k experts, pallas_kernels.moe runs them.

    router logits  h [T, H] @ router[E, H].T, accumulated in float32 and rounded to h's dtype (HF's F.linear)
    probabilities  softmax over the E experts, in float32
    choice         the k largest probabilities (lax.top_k: among equal ones the lower expert id first)
    weights        those k probabilities, divided by their sum where config.norm_topk_prob (Mixtral always:
                   top-k of the logits then softmax over the k is the same thing)
    out            sum over the k of weight * expert(h)  (+ Qwen2-MoE: sigmoid(h @ shared_gate.T) * shared MLP(h))

Every token reaches all of its k experts: no capacity, nothing dropped.

Ties: torch.topk on CPU selects among equal values by its nth_element's partition order, which is not a rule
over the indices; lax.top_k keeps the lower id. Both return the same k values, so the weights agree; where equal
probabilities straddle the k-th place the two may choose different (equally weighted) experts.

Under tensor parallelism this runs on one device's share: its slice of every expert's intermediate axis (the
output is a partial sum, like the dense MLP's), or with expert parallelism its E/N whole experts, the router's
global ids shifted by `first_expert` so that the contract's out-of-range ids mask the other devices' experts.

The expert stacks are dense [E, N, K] arrays or AWQ int4 (AWQWeight with a leading [E] axis on every leaf, from an
AutoAWQ checkpoint); `expert_stack` hands pallas_kernels.moe either as it takes them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxllm.config import ModelConfig
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.kernels import Kernels
from jaxllm.model.layers import gated_mlp, linear
from jaxllm.model.params import LayerParams
from jaxllm.model.weights import WeightFormat, format_name
from pallas_kernels.awq_matmul import AWQPacked
from pallas_kernels.moe import moe_experts


def route(h: jax.Array, router: jax.Array, top_k: int, normalize: bool) -> tuple[jax.Array, jax.Array]:
    """h [T, H], router [E, H] -> (expert ids [T, k] int32, weights [T, k] float32), as the module docstring."""
    logits = linear(h, router)  # [T, E] in h's dtype
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)  # [T, E]
    weights, ids = jax.lax.top_k(probs, top_k)  # [T, k] each
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return ids.astype(jnp.int32), weights


def moe_mlp(h: jax.Array, lp: LayerParams, config: ModelConfig, kernels: Kernels,
            first_expert: jax.Array | int = 0) -> jax.Array:
    """h [T, H] -> this device's share of the sparse layer's MLP output [T, H] (a partial sum over the devices)."""
    ids, weights = route(h, lp.router, config.num_experts_per_tok, config.norm_topk_prob)  # [T, k] each
    out = moe_experts(h, ids - first_expert, weights, expert_stack(lp.w_experts_gate_up),
                      expert_stack(lp.w_experts_down),
                      activation=config.arch.activation, implementation=kernels.moe,
                      interpret=kernels.interpret)  # [T, H]
    if lp.w_shared_gate_up is None:
        return out
    shared = gated_mlp(h, lp.w_shared_gate_up, lp.w_shared_down, kernels, config.arch.activation)  # [T, H]
    gate = jax.nn.sigmoid(linear(h, lp.shared_gate))  # [T, 1]
    return out + gate * shared


def expert_stack(w) -> jax.Array | AWQPacked:
    """A LayerParams expert stack as pallas_kernels.moe takes it: a dense [E, N, K] array, or an AWQWeight's packed
    leaves [E, K/8 | K/G, N]; TypeError naming any other format (a LoRA delta on experts is not implemented)."""
    if isinstance(w, AWQWeight):
        return w.packed
    if isinstance(w, WeightFormat):
        raise TypeError(f"expert weights in the {format_name(w)} format are not supported (dense or AWQ int4 only)")
    return w
