"""Mixture-of-experts MLP: each token's k routed experts. `moe_experts` runs the implementation Kernels.moe names;
reference.py holds the contract and the oracle. The expert stacks may be dense arrays or AWQ int4 (awq.py): the
reference dequantizes every expert, the cpu loop each used expert, the Pallas kernels each weight tile in
registers (awq_kernel.py)."""

from __future__ import annotations

import jax

from pallas_kernels.moe.awq import check_expert_stack, dense_experts
from pallas_kernels.moe.cpu import moe_experts_cpu
from pallas_kernels.moe.kernel import moe_experts_pallas
from pallas_kernels.moe.reference import moe_experts_reference

IMPLEMENTATIONS = ("cpu", "pallas", "reference")


def moe_experts(x: jax.Array, expert_ids: jax.Array, expert_weights: jax.Array, w_gate_up, w_down, *,
                activation: str = "silu", implementation: str = "reference", interpret: bool = False) -> jax.Array:
    """[T, H] -> [T, H]: reference.py's contract, by `implementation` (one of IMPLEMENTATIONS). w_gate_up [E, 2I, H]
    and w_down [E, H, I] dense, or AWQPacked stacks standing for them (awq.py)."""
    check_expert_stack(w_gate_up, "w_gate_up")
    check_expert_stack(w_down, "w_down")
    if implementation == "reference":
        return moe_experts_reference(x, expert_ids, expert_weights, dense_experts(w_gate_up, x.dtype),
                                     dense_experts(w_down, x.dtype), activation)
    if implementation == "cpu":
        return moe_experts_cpu(x, expert_ids, expert_weights, w_gate_up, w_down, activation)
    if implementation == "pallas":
        return moe_experts_pallas(x, expert_ids, expert_weights, w_gate_up, w_down, activation, interpret=interpret)
    raise ValueError(f"moe implementation {implementation!r} is unknown; choose one of {', '.join(IMPLEMENTATIONS)}")


__all__ = ["IMPLEMENTATIONS", "moe_experts", "moe_experts_cpu", "moe_experts_pallas", "moe_experts_reference"]
