"""The mixture-of-experts MLP in plain jnp: the exact oracle for every other implementation.

    x               [T, H]        one step's tokens (any float dtype)
    expert_ids      [T, k] int32  each token's k routed experts (the router's choice); an id outside [0, E)
                                  contributes nothing (expert parallelism passes global ids minus its first expert)
    expert_weights  [T, k] f32    each route's combine weight (the router's, renormalized or not)
    w_gate_up       [E, 2I, H]    per expert: gate rows, then up rows (the dense MLP's layout, stacked)
    w_down          [E, H, I]

    out[t] = sum_j expert_weights[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t])),  e = expert_ids[t, j]

Each expert's MLP runs in x's dtype with float32 accumulation and is rounded to x's dtype (as the dense MLP's
linear does); the k outputs are combined in float32 and rounded once to x's dtype.

This oracle runs every expert on every token ([E, T, ...] intermediates) and keeps each token's routed ones: work
in proportion to E, fine for tests and tiny models. The routed implementations (sorted tokens, grouped matmuls)
have the same contract and are tested against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True)}


def moe_experts_reference(x: jax.Array, expert_ids: jax.Array, expert_weights: jax.Array, w_gate_up: jax.Array,
                          w_down: jax.Array, activation: str = "silu") -> jax.Array:
    """-> [T, H] in x.dtype: each token's routed experts' outputs, combined with their weights."""
    num_experts = w_gate_up.shape[0]
    gate_up = jnp.einsum("th,efh->etf", x, w_gate_up.astype(x.dtype),
                         preferred_element_type=jnp.float32).astype(x.dtype)  # [E, T, 2I]
    gate, up = jnp.split(gate_up, 2, axis=-1)  # [E, T, I] each
    hidden = ACTIVATIONS[activation](gate) * up
    out = jnp.einsum("eti,ehi->eth", hidden, w_down.astype(x.dtype),
                     preferred_element_type=jnp.float32).astype(x.dtype)  # [E, T, H]
    routed = expert_ids[:, :, None] == jnp.arange(num_experts, dtype=expert_ids.dtype)  # [T, k, E]
    combine = jnp.sum(jnp.where(routed, expert_weights[:, :, None].astype(jnp.float32), 0.0), axis=1)  # [T, E]
    return jnp.einsum("te,eth->th", combine, out.astype(jnp.float32)).astype(x.dtype)
