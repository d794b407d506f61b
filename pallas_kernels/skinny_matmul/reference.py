"""The skinny matmul's contract in plain jnp: x [..., K] @ w[N, K].T -> [..., N], accumulated in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dense_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., K] (float32 or bfloat16) @ w [N, K].T -> [..., N] float32."""
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (w.ndim - 1,)), ((), ())), preferred_element_type=jnp.float32)
