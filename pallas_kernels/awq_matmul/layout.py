"""AutoAWQ "GEMM" int4 tensors -> the K-packed layout the kernels and the reference read (host side, numpy).

AutoAWQ checkpoint, one linear layer y = x @ W, W [K, N], group size G (K % G == 0):

    qweight  int32 [K, N/8]     eight 4-bit q[k, n] per word, columns interleaved (below)
    qzeros   int32 [K/G, N/8]   eight 4-bit z[k // G, n] per word, same interleave
    scales   fp16  [K/G, N]     s[k // G, n]
    W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]

    AutoAWQ word, columns 8c .. 8c+7:   bits 31..28 27..24 23..20 19..16 15..12 11..8  7..4  3..0
                                        col  8c+7   8c+5   8c+3   8c+1   8c+6   8c+4  8c+2  8c+0
    (nibble j holds column 8c + AWQ_ORDER[j])

Kernel layout (AWQPacked): the same q, packed eight consecutive *rows* k per word instead of eight columns, zeros
unpacked to one byte, scales as given:

    qweight  int32 [K/8, N]      word [r, n]: bits 4j..4j+3 hold q[8r + j, n]   (j = 0..7, natural order)
    zeros    int8  [K/G, N]      z[g, n] in 0..15
    scales   fp16  [K/G, N]      s[g, n] (the checkpoint's dtype is kept; `with_scale_dtype` casts them)

          n ->                                         one word = q[8r .. 8r+7, n]
     r  +------+------+------+--                       +----+----+----+----+----+----+----+----+
     |  | 8r.. | 8r.. | 8r.. |                         | j7 | j6 | j5 | j4 | j3 | j2 | j1 | j0 |  bits 31..0
     v  | 8r+7 | 8r+7 | 8r+7 |                         +----+----+----+----+----+----+----+----+
        +------+------+------+--                         j -> row 8r + j of column n

Why this layout: N is a plain array axis of every leaf (the last one), so column tiles, tensor-parallel column
shards and any column selection (fused q|k|v per KV head group) are ordinary indexing of the device arrays, with no
unpacking. K is the first axis of every leaf: a shard of rows [a, b) with a, b multiples of G is qweight[a/8 : b/8]
and zeros/scales[a/G : b/G]. In the kernel, nibble j of a [BK/8, BN] tile of words is the weight of rows
k0 + 8r + j, which the dot meets with the activation columns k0 + 8r + j: eight dots of depth BK/8 per tile, each
word loaded once. One byte per zero keeps the dequantization exact ((q - z) * s rounded once) at 1/G byte per
weight, against 1/(2G) for packed zeros.

Scales in the activation dtype: unless the scales share the activations' dtype, the kernel dequantizes through
float32, a conversion per weight (kernel.py). AutoAWQ's scales are fp16 and activations usually bf16, so a loader
casts them once with `with_scale_dtype(packed, activation dtype)`: each scale is rounded to bf16's 8 significant bits
(a relative change of at most 2^-9), and each weight (q - z) * s is then rounded to bf16 as before. Scales left in
fp16 still give bf16 activations correct results, through that float32 path.

Leaves may carry leading axes (host-side helpers batch over them); the kernels take one layer's 2-D leaves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: nibble j of a word holds column 8c + AWQ_ORDER[j]
_NIBBLE_SHIFTS = 4 * np.arange(8, dtype=np.uint32)  # [8] bit offset of nibble j
SCALE_DTYPES = tuple(jnp.dtype(d) for d in (jnp.bfloat16, jnp.float16, jnp.float32))  # with_scale_dtype's targets


@struct.dataclass
class AWQPacked:
    """One int4 linear weight W [K, N] (y = x @ W) in the kernel layout; leaves may carry leading [L, ...] axes."""

    qweight: jax.Array  # [..., K/8, N] int32, word [r, n] holds q[8r + j, n] in bits 4j..4j+3
    zeros: jax.Array  # [..., K/G, N] int8, z in 0..15
    scales: jax.Array  # [..., K/G, N] float16 (or the checkpoint's scale dtype)

    @property
    def k(self) -> int:
        return 8 * self.qweight.shape[-2]

    @property
    def n(self) -> int:
        return self.qweight.shape[-1]

    @property
    def group_size(self) -> int:
        """G, read off the shapes (K / number of groups), so a K-shard of a row-parallel layer keeps its own."""
        return self.k // self.scales.shape[-2]


def repack(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> AWQPacked:
    """AutoAWQ GEMM tensors (qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N]) -> AWQPacked of
    numpy arrays (the caller puts them on its devices)."""
    qweight, qzeros, scales = np.asarray(qweight), np.asarray(qzeros), np.asarray(scales)
    k, n = qweight.shape[0], 8 * qweight.shape[1]
    _check_shapes(k, n, group_size, qzeros.shape, scales.shape)
    q = unpack_awq_columns(qweight)  # [K, N] uint8
    z = unpack_awq_columns(qzeros)  # [K/G, N] uint8
    return AWQPacked(qweight=pack_rows(q), zeros=z.astype(np.int8), scales=scales.copy())


def with_scale_dtype(packed: AWQPacked, dtype) -> AWQPacked:
    """The same weights with the scales cast to `dtype` (round to nearest even), qweight and zeros shared: the step
    that lets bf16 (f16) activations meet bf16 (f16) scales and skip the kernel's float32 dequantization. Host numpy
    or device leaves, any leading axes; a float32 target is exact but gains nothing (float32 activations take the
    float32 path whatever the scales)."""
    dtype = jnp.dtype(dtype)
    if dtype not in SCALE_DTYPES:
        raise ValueError(f"scales must be bfloat16, float16 or float32, got {dtype}")
    return AWQPacked(qweight=packed.qweight, zeros=packed.zeros, scales=packed.scales.astype(dtype))


def to_awq(packed: AWQPacked) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of `repack` for one layer: (qweight, qzeros, scales) in AutoAWQ's layout (needs N % 8 == 0)."""
    q = unpack_rows(np.asarray(packed.qweight))  # [K, N]
    z = np.asarray(packed.zeros).astype(np.uint8)  # [K/G, N]
    return pack_awq_columns(q), pack_awq_columns(z), np.asarray(packed.scales).copy()


def unpack(packed: AWQPacked) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One layer's (q [K, N] uint8, z [K/G, N] uint8, s [K/G, N]) as host arrays."""
    return (unpack_rows(np.asarray(packed.qweight)), np.asarray(packed.zeros).astype(np.uint8),
            np.asarray(packed.scales))


def unpack_awq_columns(words: np.ndarray) -> np.ndarray:
    """[R, C/8] int32 in AutoAWQ's interleaved column order -> [R, C] uint8 nibbles."""
    nibbles = _nibbles(words)  # [R, C/8, 8], nibble j last
    columns = nibbles[..., np.argsort(AWQ_ORDER)]  # column c of each group of eight is nibble AWQ_ORDER.index(c)
    return columns.reshape(words.shape[0], -1)


def pack_awq_columns(values: np.ndarray) -> np.ndarray:
    """[R, C] values in 0..15 (C % 8 == 0) -> [R, C/8] int32 in AutoAWQ's interleaved column order."""
    rows, cols = values.shape
    groups = values.reshape(rows, cols // 8, 8)[..., list(AWQ_ORDER)]  # [R, C/8, 8], nibble j last
    return _words(groups)


def pack_rows(q: np.ndarray) -> np.ndarray:
    """[K, N] values in 0..15 (K % 8 == 0) -> [K/8, N] int32, word [r, n] holding q[8r + j, n] in nibble j."""
    k, n = q.shape
    return _words(q.reshape(k // 8, 8, n).transpose(0, 2, 1))  # [K/8, N, 8], nibble j last


def unpack_rows(words: np.ndarray) -> np.ndarray:
    """[K/8, N] int32 -> [K, N] uint8: the inverse of `pack_rows`."""
    r, n = words.shape
    return _nibbles(words).transpose(0, 2, 1).reshape(8 * r, n)  # [K/8, 8, N] -> [K, N]


def _nibbles(words: np.ndarray) -> np.ndarray:
    """[..., W] int32 -> [..., W, 8] uint8, nibble j (bits 4j..4j+3) at index j."""
    bits = words.astype(np.int32).view(np.uint32)
    return ((bits[..., None] >> _NIBBLE_SHIFTS) & 0xF).astype(np.uint8)


def _words(nibbles: np.ndarray) -> np.ndarray:
    """[..., W, 8] values in 0..15 -> [..., W] int32 with index j in bits 4j..4j+3."""
    if nibbles.size and (nibbles.min() < 0 or nibbles.max() > 15):
        raise ValueError("int4 values must lie in 0..15")
    bits = (nibbles.astype(np.uint32) << _NIBBLE_SHIFTS).sum(axis=-1, dtype=np.uint32)
    return bits.view(np.int32)


def _check_shapes(k: int, n: int, group_size: int, qzeros_shape, scales_shape) -> None:
    if group_size % 8 or k % group_size:
        raise ValueError(f"group size {group_size} must be a multiple of 8 dividing K = {k}")
    groups = k // group_size
    if tuple(qzeros_shape) != (groups, n // 8) or tuple(scales_shape) != (groups, n):
        raise ValueError(f"qweight [{k}, {n // 8}] with G = {group_size} needs qzeros [{groups}, {n // 8}] and "
                         f"scales [{groups}, {n}], got {tuple(qzeros_shape)} and {tuple(scales_shape)}")
