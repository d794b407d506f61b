"""Random multi-LoRA cases and tolerances, shared by the kernel tests and the GPU check script."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# relative_error bounds, kernel (interpret mode on a CPU) vs the reference: the same float32 sums in another order
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 5e-3, jnp.dtype(jnp.float16): 1e-3}
# on a GPU float32 dots run as TF32 inside the kernel (the XLA reference may use full float32)
GPU_TOLERANCE = {jnp.dtype(jnp.float32): 1e-2, jnp.dtype(jnp.bfloat16): 2e-2, jnp.dtype(jnp.float16): 5e-3}


class LoraCase(NamedTuple):
    x: jax.Array  # [T, K]
    a: jax.Array  # [S, R, K]
    b: jax.Array  # [S, N, R]
    token_slots: jax.Array  # [T] int32

    def args(self) -> tuple:
        return tuple(self)


def random_case(seed: int, num_tokens: int, k: int, n: int, rank: int, num_slots: int, slots, dtype,
                weight_dtype=None) -> LoraCase:
    """x standard normal, a and b scaled so that the delta is O(1); weights in weight_dtype (default: dtype).

    slots: an explicit [T] list, or "runs" (contiguous runs over every slot and 0, like requests of a step),
    "interleaved" (uniform over 0..S) or "adapters:D" (D contiguous runs of slots 1..D, no base tokens).
    """
    rng = np.random.default_rng(seed)
    weight_dtype = weight_dtype or dtype
    x = rng.standard_normal((num_tokens, k), np.float32)
    a = rng.standard_normal((num_slots, rank, k), np.float32) / np.sqrt(k)
    b = rng.standard_normal((num_slots, n, rank), np.float32) / np.sqrt(rank)
    return LoraCase(jnp.asarray(x).astype(dtype), jnp.asarray(a).astype(weight_dtype),
                    jnp.asarray(b).astype(weight_dtype), jnp.asarray(token_slots(rng, num_tokens, num_slots, slots)))


def token_slots(rng: np.random.Generator, num_tokens: int, num_slots: int, pattern) -> np.ndarray:
    """[T] int32 slot ids following `pattern` (see random_case)."""
    if not isinstance(pattern, str):
        return np.asarray(pattern, np.int32)
    if pattern == "interleaved":
        return rng.integers(0, num_slots + 1, num_tokens).astype(np.int32)
    if pattern.startswith("adapters:"):
        distinct = int(pattern.split(":")[1])
        return (1 + np.arange(num_tokens) * distinct // max(num_tokens, 1)).astype(np.int32)
    if pattern == "runs":  # slots in a shuffled order, zeros among them, in runs of random lengths
        order = rng.permutation(np.arange(num_slots + 1))
        cuts = np.sort(rng.integers(0, num_tokens + 1, num_slots))
        return np.repeat(order, np.diff(np.concatenate([[0], cuts, [num_tokens]]))).astype(np.int32)
    raise ValueError(f"unknown slot pattern {pattern!r}")


def relative_error(actual, expected) -> float:
    """max |actual - expected| / max |expected|, in float32."""
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30))
