"""The row argmax's contract in plain jnp: jnp.argmax over the last axis (the first index among equal largest
values; NaN counts as the largest)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def argmax_rows(x: jax.Array) -> jax.Array:
    """x [R, V] -> [R] int32."""
    return jnp.argmax(x, axis=-1).astype(jnp.int32)
