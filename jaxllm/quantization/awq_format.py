"""AutoAWQ's GEMM checkpoint format for 4-bit weights: packing, unpacking and dequantizing (numpy, host side).

A linear with input size K and output size N (Hugging Face keeps its weight as [N, K]) is stored transposed, with
groups of G consecutive input rows sharing a scale and a zero point per output column:

    qweight  int32 [K, N/8]     the 4-bit codes q, eight columns per word
    qzeros   int32 [K/G, N/8]   the 4-bit zero points, packed the same way
    scales   fp16  [K/G, N]
    W[k, n] = (q[k, n] - zero[k // G, n]) * scale[k // G, n]          W [K, N] = the HF weight transposed

Within a word, nibble j (bits 4j .. 4j+3) holds column AWQ_ORDER[j] of its group of eight columns. The interleave is
AutoAWQ's: its GEMM kernels unpack nibbles in that order with shifts that suit their fp16 conversion trick; other
AWQ loaders (vLLM, transformers) expect exactly this order, so it is part of the format.
"""

from __future__ import annotations

import numpy as np

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j -> column within each group of eight
BITS = 4
PACK = 32 // BITS  # values per int32 word
_SHIFTS = np.arange(PACK, dtype=np.uint32) * BITS  # [8]: nibble j sits at bits 4j .. 4j+3


def pack_int4(values: np.ndarray) -> np.ndarray:
    """[R, N] integers in 0..15 -> [R, N/8] int32 words in AWQ's nibble order."""
    values = np.asarray(values)
    rows, cols = values.shape
    if cols % PACK:
        raise ValueError(f"the packed axis must be a multiple of {PACK}, got {cols}")
    if values.size and (values.min() < 0 or values.max() > 15):
        raise ValueError(f"4-bit values must lie in 0..15, got {values.min()}..{values.max()}")
    nibbles = values.astype(np.uint32).reshape(rows, cols // PACK, PACK)[:, :, list(AWQ_ORDER)]  # [R, N/8, 8]
    words = np.bitwise_or.reduce(nibbles << _SHIFTS, axis=-1)  # [R, N/8] uint32
    return words.view(np.int32)


def unpack_int4(words: np.ndarray) -> np.ndarray:
    """[R, N/8] int32 words -> [R, N] int32 values in 0..15 (the inverse of pack_int4)."""
    words = np.asarray(words)
    if words.dtype != np.int32:
        raise ValueError(f"packed 4-bit words must be int32, got {words.dtype}")
    nibbles = (words.view(np.uint32)[:, :, None] >> _SHIFTS) & 0xF  # [R, N/8, 8] in nibble order
    values = np.empty_like(nibbles)
    values[:, :, list(AWQ_ORDER)] = nibbles  # column AWQ_ORDER[j] <- nibble j
    return values.reshape(words.shape[0], -1).astype(np.int32)


def pack_awq(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes q [K, N], zero points [K/G, N] (integers 0..15) and scales [K/G, N] -> the checkpoint's
    (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales fp16 [K/G, N])."""
    k, n = q.shape
    if zeros.shape != scales.shape or zeros.shape[1] != n or zeros.shape[0] == 0 or k % zeros.shape[0]:
        raise ValueError(f"zeros {zeros.shape} and scales {scales.shape} must be [K/G, N] for codes {q.shape}")
    return pack_int4(q), pack_int4(zeros), np.asarray(scales).astype(np.float16)


def unpack_awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray,
               group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The checkpoint's three tensors -> (codes int32 [K, N], zero points int32 [K/G, N], scales fp16 [K/G, N])."""
    q, zeros = unpack_int4(qweight), unpack_int4(qzeros)
    k, n = q.shape
    if k % group_size or zeros.shape != (k // group_size, n) or scales.shape != zeros.shape:
        raise ValueError(f"qweight {qweight.shape}, qzeros {qzeros.shape} and scales {scales.shape} do not form "
                         f"an AWQ weight of group size {group_size}")
    return q, zeros, np.asarray(scales)


def dequantize_awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """The checkpoint's three tensors -> W [K, N] float32 (transpose for the HF [N, K] layout)."""
    q, zeros, scales = unpack_awq(qweight, qzeros, scales, group_size)
    k, n = q.shape
    groups = q.reshape(k // group_size, group_size, n)  # [K/G, G, N]
    w = (groups - zeros[:, None, :]).astype(np.float32) * scales.astype(np.float32)[:, None, :]
    return w.reshape(k, n)
