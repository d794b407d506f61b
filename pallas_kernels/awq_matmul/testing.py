"""Random AutoAWQ tensors and activations, shared by the kernel tests and the GPU check script."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.awq_matmul.layout import AWQPacked, repack, with_scale_dtype

# relative_error bounds for the kernel on a GPU against the reference (which rounds the weights as the kernel does):
# loose, for the tensor cores' sums and tf32 dots of float32 activations; in interpret mode the error is ~1e-7
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2e-2, jnp.dtype(jnp.float16): 5e-3}


def random_awq_tensors(seed: int, k: int, n: int, group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AutoAWQ (qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N] fp16): every bit pattern of a
    word is a valid set of eight nibbles, so the words are uniform random int32."""
    rng = np.random.default_rng(seed)

    def words(shape):
        return rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)

    scales = (rng.uniform(0.5, 1.5, size=(k // group_size, n)) / (8 * np.sqrt(k))).astype(np.float16)
    return words((k, n // 8)), words((k // group_size, n // 8)), scales


def random_packed(seed: int, k: int, n: int, group_size: int, scale_dtype=jnp.float16) -> AWQPacked:
    """Random weights of the given shape, repacked (scales cast to scale_dtype) and put on the default device."""
    packed = with_scale_dtype(repack(*random_awq_tensors(seed, k, n, group_size), group_size), scale_dtype)
    return jax.tree.map(jnp.asarray, packed)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def device_random_packed(seed: int, k: int, n: int, group_size: int, scale_dtype=jnp.float16) -> AWQPacked:
    """Random weights generated in the kernel layout on the device (any word is eight valid nibbles): instant at
    Llama-3-8B sizes, where repacking on the host takes seconds. scale_dtype bf16 with bf16 activations (f16 with
    f16) exercises the kernel's 16-bit dequantization; the default fp16 scales its float32 path for bf16."""
    kq, kz, ks = jax.random.split(jax.random.key(seed), 3)
    qweight = jax.lax.bitcast_convert_type(jax.random.bits(kq, (k // 8, n), jnp.uint32), jnp.int32)
    zeros = jax.random.randint(kz, (k // group_size, n), 0, 16, jnp.int32).astype(jnp.int8)
    scales = (jax.random.uniform(ks, (k // group_size, n), jnp.float32, 0.5, 1.5) / (8 * k ** 0.5)).astype(jnp.float16)
    return with_scale_dtype(AWQPacked(qweight=qweight, zeros=zeros, scales=scales), scale_dtype)


def random_activations(seed: int, m: int, k: int, dtype) -> jax.Array:
    """x [M, K] standard normal in `dtype`."""
    return jnp.asarray(np.random.default_rng(seed + 1).standard_normal((m, k), np.float32)).astype(dtype)


def relative_error(actual, expected) -> float:
    """max |actual - expected| / max |expected|, in float32."""
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30))
