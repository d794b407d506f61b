"""Plain-jnp int4 AWQ matmul: the contract the kernels are tested against, and the CPU path of the engine.

y[m, n] = sum_k x[m, k] * W[k, n],  W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]   (layout.py for q, z, s)

The weight is dequantized with vectorized shifts (no loop over columns or nibbles) exactly as the kernels do it:
(q - z) * s with the scales as stored (their dtype is the packed arrays', e.g. bf16 after `layout.with_scale_dtype`),
exact in float32, rounded once to x's dtype; then multiplied in float32 (a bf16 or f16 x is exact there). So
kernel and reference see the same weights, bit for bit, and differ only in the order of the float32 sums. The
result is float32 [..., N] and the caller casts it. On a CPU, writing a whole float32 W [K, N] per call
costs more than the dot (a fresh 64 MB buffer for K = N = 4096 takes ~40 ms to touch on 2 cores), so the reference
walks K in chunks of whole groups, each dequantized into a cache-sized [KC, N] buffer and accumulated:

    K rows  |-- chunk 0 --|-- chunk 1 --| ... |    KC = c * G rows, c the largest divisor of K/G whose
    acc [M, N] += x[:, chunk] @ W[chunk, :]         float32 chunk fits CHUNK_BYTES (one group at least)

Measured on 2 CPU cores, K = 4096, N = 14336: 30 ms at M = 1 and 108 ms at M = 64, against 128 and 228 ms for the
whole-W version.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.awq_matmul.layout import AWQPacked

CHUNK_BYTES = 2 << 20  # float32 bytes of dequantized weight per chunk: stays in a CPU's L2 / L3


def awq_matmul_reference(x: jax.Array, packed: AWQPacked) -> jax.Array:
    """x [..., K] @ W [K, N] -> [..., N] float32, W dequantized chunk by chunk, each weight rounded once to x's dtype
    (as the kernels round it) and held in float32 for the dot."""
    k, n, group = packed.k, packed.n, packed.group_size
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).astype(jnp.float32)  # [M, K]
    groups = k // group
    per_chunk = max(d for d in range(1, groups + 1) if groups % d == 0 and (d == 1 or d * group * n * 4 <= CHUNK_BYTES))
    steps = groups // per_chunk
    if steps == 1:
        return jnp.dot(x2, _weights(packed, x.dtype), preferred_element_type=jnp.float32).reshape(*lead, n)

    chunks = AWQPacked(qweight=packed.qweight.reshape(steps, per_chunk * group // 8, n),  # [S, KC/8, N]
                       zeros=packed.zeros.reshape(steps, per_chunk, n),  # [S, c, N]
                       scales=packed.scales.reshape(steps, per_chunk, n))  # [S, c, N]
    xs = x2.reshape(x2.shape[0], steps, per_chunk * group).transpose(1, 0, 2)  # [S, M, KC]

    def step(acc, chunk):
        xc, w = chunk
        return acc + jnp.dot(xc, _weights(w, x.dtype), preferred_element_type=jnp.float32), None

    y, _ = jax.lax.scan(step, jnp.zeros((x2.shape[0], n), jnp.float32), (xs, chunks))  # [M, N]
    return y.reshape(*lead, n)


def _weights(packed: AWQPacked, x_dtype) -> jax.Array:
    """W [K, N] rounded to x's dtype (what the kernels feed the tensor cores), held in float32 for the dot."""
    return dequantize(packed, x_dtype).astype(jnp.float32)


def dequantize(packed: AWQPacked, dtype=jnp.float32) -> jax.Array:
    """One layer's W [K, N] in `dtype`, computed in float32 ((q - z) * s is exact there) and rounded once."""
    words = packed.qweight  # [K/8, N] int32
    k, n, group = packed.k, packed.n, packed.group_size
    shifts = 4 * jnp.arange(8, dtype=jnp.int32)  # [8]: nibble j holds row 8r + j
    q = jnp.right_shift(words[:, None, :], shifts[None, :, None]) & 0xF  # [K/8, 8, N]
    q = q.reshape(k // group, group, n)  # [K/G, G, N]: row 8r + j sits at (8r + j) // G, (8r + j) % G
    z = packed.zeros.astype(jnp.int32)[:, None, :]  # [K/G, 1, N]
    s = packed.scales.astype(jnp.float32)[:, None, :]  # [K/G, 1, N]
    return ((q - z).astype(jnp.float32) * s).reshape(k, n).astype(dtype)
