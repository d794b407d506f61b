"""The contract of the gated MLP's activation and product, as the model computes it in jnp.

gate_up [T, 2F] (the gate's F columns, then the up projection's) -> act(gate) * up [T, F] in gate_up's dtype; in a
16-bit dtype the activation and the product each round once, computed in float32 (as torch's kernels do).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def gated_activation_reference(gate_up: jax.Array, activation: str = "silu") -> jax.Array:
    gate, up = jnp.split(gate_up, 2, axis=-1)  # [T, F] each
    act = ACTIVATIONS[activation](gate.astype(jnp.float32)).astype(gate_up.dtype)  # [T, F]
    return (act.astype(jnp.float32) * up.astype(jnp.float32)).astype(gate_up.dtype)  # [T, F]
