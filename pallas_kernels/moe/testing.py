"""Random MoE cases and tolerances, shared by the kernel tests and the benchmark."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# max |implementation - reference| / max |reference|. float32: the same float32 sums in another order.
# bfloat16: both round gate_up, the hidden product and each expert's output to bfloat16 at the same points, but a
# float32 sum in another order can land on the other side of a rounding boundary: one bf16 ulp (2^-8 relative)
# of an intermediate, carried through the down projection; 2^-6 of the output's scale leaves room for a few.
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2 ** -6}


class MoeCase(NamedTuple):
    x: jax.Array  # [T, H]
    expert_ids: jax.Array  # [T, k] int32
    expert_weights: jax.Array  # [T, k] float32
    w_gate_up: jax.Array  # [E, 2I, H]
    w_down: jax.Array  # [E, H, I]


def random_case(seed: int, num_tokens: int, top_k: int, num_experts: int, hidden: int, inter: int, dtype,
                routing="uniform") -> MoeCase:
    """Weights scaled so every stage is O(1). routing: "uniform" (distinct experts per token when k <= E),
    "one" (every route to expert 0), "skewed" (most routes to few experts, several experts empty),
    "out_of_range" (a third of the ids outside [0, E): -1, E, E + 5), or an explicit [T, k] list."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_tokens, hidden), np.float32)
    w_gate_up = rng.standard_normal((num_experts, 2 * inter, hidden), np.float32) / np.sqrt(hidden)
    w_down = rng.standard_normal((num_experts, hidden, inter), np.float32) / np.sqrt(inter)
    weights = rng.random((num_tokens, top_k), np.float32)
    ids = routing_ids(rng, num_tokens, top_k, num_experts, routing)
    return MoeCase(jnp.asarray(x).astype(dtype), jnp.asarray(ids, jnp.int32), jnp.asarray(weights),
                   jnp.asarray(w_gate_up).astype(dtype), jnp.asarray(w_down).astype(dtype))


def routing_ids(rng, num_tokens: int, top_k: int, num_experts: int, routing) -> np.ndarray:
    """[T, k] int expert ids for the named routing (random_case)."""
    if not isinstance(routing, str):
        return np.asarray(routing).reshape(num_tokens, top_k)
    if routing == "uniform":
        if top_k <= num_experts:
            return np.stack([rng.permutation(num_experts)[:top_k] for _ in range(num_tokens)]).reshape(-1, top_k)
        return rng.integers(0, num_experts, (num_tokens, top_k))
    if routing == "one":
        return np.zeros((num_tokens, top_k), np.int64)
    if routing == "skewed":
        few = max(1, num_experts // 4)
        return np.minimum(rng.geometric(0.5, (num_tokens, top_k)) - 1, few - 1)
    if routing == "out_of_range":
        ids = rng.integers(0, num_experts, (num_tokens, top_k))
        bad = rng.random((num_tokens, top_k)) < 1 / 3
        return np.where(bad, rng.choice([-1, num_experts, num_experts + 5], (num_tokens, top_k)), ids)
    raise ValueError(f"unknown routing {routing!r}")


def relative_error(got: jax.Array, want: jax.Array) -> float:
    want = np.asarray(want, np.float32)
    return float(np.max(np.abs(np.asarray(got, np.float32) - want)) / max(np.max(np.abs(want)), 1e-30))
