"""Mixture-of-experts MLP: each token's k routed experts. `moe_experts` runs the implementation Kernels.moe names;
reference.py holds the contract and the oracle."""

from __future__ import annotations

import jax

from pallas_kernels.moe.cpu import moe_experts_cpu
from pallas_kernels.moe.kernel import moe_experts_pallas
from pallas_kernels.moe.reference import moe_experts_reference

IMPLEMENTATIONS = ("cpu", "pallas", "reference")


def moe_experts(x: jax.Array, expert_ids: jax.Array, expert_weights: jax.Array, w_gate_up: jax.Array,
                w_down: jax.Array, *, activation: str = "silu", implementation: str = "reference",
                interpret: bool = False) -> jax.Array:
    """[T, H] -> [T, H]: reference.py's contract, by `implementation` (one of IMPLEMENTATIONS)."""
    if implementation == "reference":
        return moe_experts_reference(x, expert_ids, expert_weights, w_gate_up, w_down, activation)
    if implementation == "cpu":
        return moe_experts_cpu(x, expert_ids, expert_weights, w_gate_up, w_down, activation)
    if implementation == "pallas":
        return moe_experts_pallas(x, expert_ids, expert_weights, w_gate_up, w_down, activation, interpret=interpret)
    raise ValueError(f"moe implementation {implementation!r} is unknown; choose one of {', '.join(IMPLEMENTATIONS)}")


__all__ = ["IMPLEMENTATIONS", "moe_experts", "moe_experts_cpu", "moe_experts_pallas", "moe_experts_reference"]
