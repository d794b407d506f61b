"""AWQ int4 expert stacks: an AWQPacked whose leaves carry a leading expert axis, standing for a dense stack.

    w_gate_up  dense [E, 2I, H]   packed: qweight [E, H/8, 2I], zeros / scales [E, H/G, 2I]   (gate | up on N)
    w_down     dense [E, H, I]    packed: qweight [E, I/8, H],  zeros / scales [E, I/G, H]

Each expert is pallas_kernels/awq_matmul/layout.py's layout of its own W [K, N]; the stack is those leaves stacked
on a new axis 0. Dequantized, an expert is awq_matmul's W rounded once to the activations' dtype (`dequantize`),
transposed to the dense [N, K] the MoE contract takes: the same weights the AWQ matmul reference multiplies.
"""

from __future__ import annotations

import jax

from pallas_kernels.awq_matmul.layout import AWQPacked
from pallas_kernels.awq_matmul.reference import dequantize


def is_packed(w) -> bool:
    """Whether an expert stack is int4 (AWQPacked) rather than a dense [E, N, K] array."""
    return isinstance(w, AWQPacked)


def num_experts(w) -> int:
    """E of a dense or packed stack."""
    return (w.qweight if is_packed(w) else w).shape[0]


def expert_weight(w, expert: jax.Array | int, dtype) -> jax.Array:
    """One expert of a dense [E, N, K] or packed stack -> its dense W [N, K] in `dtype` (a packed expert is
    dequantized here: only this expert's words are read)."""
    if not is_packed(w):
        return w[expert].astype(dtype)
    one = jax.tree.map(lambda leaf: leaf[expert], w)  # AWQPacked of [K/8, N], [K/G, N]
    return dequantize(one, dtype).T  # [N, K]


def dense_experts(w, dtype) -> jax.Array:
    """A dense or packed stack -> the dense [E, N, K] in `dtype` (every expert dequantized: the oracle's way)."""
    if not is_packed(w):
        return w.astype(dtype)
    return jax.vmap(lambda one: dequantize(one, dtype).T)(w)  # [E, N, K]


def check_expert_stack(w, name: str) -> None:
    """ValueError naming the stack when a packed one is not [E, K/8, N] with whole groups of rows."""
    if not is_packed(w):
        return
    if w.qweight.ndim != 3 or w.zeros.shape != w.scales.shape or w.zeros.shape[:1] + w.zeros.shape[2:] != (
            w.qweight.shape[0], w.qweight.shape[2]) or w.k % w.zeros.shape[1]:
        raise ValueError(f"{name}: an int4 expert stack needs qweight [E, K/8, N] and zeros / scales [E, K/G, N] "
                         f"with G dividing K; got {w.qweight.shape}, {w.zeros.shape}, {w.scales.shape}")


__all__ = ["AWQPacked", "check_expert_stack", "dense_experts", "expert_weight", "is_packed", "num_experts"]
