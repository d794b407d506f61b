"""The AWQ GEMM packing: exact round trips through a safetensors file, and agreement with an unpacker written here
from the format's description alone (it imports nothing from the packer)."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxllm.quantization.awq_format import dequantize_awq, pack_awq, unpack_awq

# The format, as documented: qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales fp16 [K/G, N]; nibble j
# (bits 4j .. 4j+3) of each word holds column [0, 2, 4, 6, 1, 3, 5, 7][j] of its group of eight columns;
# W[k, n] = (q[k, n] - zero[k // G, n]) * scale[k // G, n].
NIBBLE_TO_COLUMN = [0, 2, 4, 6, 1, 3, 5, 7]


def reference_unpack(words: np.ndarray) -> np.ndarray:
    """int32 [R, C] -> [R, 8C], one Python int at a time."""
    rows, cols = words.shape
    out = np.zeros((rows, cols * 8), dtype=np.int64)
    for r in range(rows):
        for c in range(cols):
            word = int(words[r, c]) & 0xFFFFFFFF  # the 32 bits, whatever the sign
            for j in range(8):
                out[r, 8 * c + NIBBLE_TO_COLUMN[j]] = (word >> (4 * j)) & 0xF
    return out


def reference_dequantize(qweight, qzeros, scales, group_size):
    q, z = reference_unpack(qweight), reference_unpack(qzeros)
    w = np.zeros(q.shape, dtype=np.float64)
    for k in range(q.shape[0]):
        w[k] = (q[k] - z[k // group_size]) * scales[k // group_size].astype(np.float64)
    return w


def random_quantized(rng, k=64, n=48, group_size=16):
    q = rng.integers(0, 16, size=(k, n))
    zeros = rng.integers(0, 16, size=(k // group_size, n))
    scales = rng.uniform(1e-3, 0.1, size=(k // group_size, n)).astype(np.float16)
    return q, zeros, scales


def test_round_trip_through_a_file_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    for k, n, group_size in [(64, 48, 16), (128, 8, 128), (96, 256, 32)]:
        q, zeros, scales = random_quantized(rng, k, n, group_size)
        qweight, qzeros, scales16 = pack_awq(q, zeros, scales)
        assert (qweight.dtype, qzeros.dtype, scales16.dtype) == (np.int32, np.int32, np.float16)
        assert qweight.shape == (k, n // 8) and qzeros.shape == (k // group_size, n // 8)
        assert scales16.shape == (k // group_size, n)
        path = tmp_path / f"w{k}x{n}.safetensors"
        save_file({"qweight": qweight, "qzeros": qzeros, "scales": scales16}, str(path))
        with safe_open(str(path), framework="numpy") as f:
            read = [f.get_tensor(name) for name in ("qweight", "qzeros", "scales")]
        q2, zeros2, scales2 = unpack_awq(*read, group_size)
        np.testing.assert_array_equal(q2, q)
        np.testing.assert_array_equal(zeros2, zeros)
        np.testing.assert_array_equal(scales2, scales)


def test_independent_unpacker_agrees_with_the_packer():
    rng = np.random.default_rng(1)
    q, zeros, scales = random_quantized(rng, 32, 24, 8)
    q[0, :8] = 15  # every nibble set, so the high nibble reaches the int32 sign bit
    qweight, qzeros, scales16 = pack_awq(q, zeros, scales)
    np.testing.assert_array_equal(reference_unpack(qweight), q)
    np.testing.assert_array_equal(reference_unpack(qzeros), zeros)
    np.testing.assert_allclose(dequantize_awq(qweight, qzeros, scales16, 8),
                               reference_dequantize(qweight, qzeros, scales16, 8), rtol=1e-6, atol=0)


def test_nibble_order_by_hand():
    """Columns 0..7 holding 1..8: the word reads, from the low nibble up, columns 0, 2, 4, 6, 1, 3, 5, 7."""
    q = np.arange(1, 9).reshape(1, 8)
    qweight, _, _ = pack_awq(q, np.zeros((1, 8), int), np.ones((1, 8)))
    assert int(qweight[0, 0]) & 0xFFFFFFFF == 0x86427531


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="0..15"):
        pack_awq(np.full((8, 8), 16), np.zeros((1, 8), int), np.ones((1, 8)))
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_awq(np.zeros((8, 12), int), np.zeros((1, 12), int), np.ones((1, 12)))
    qweight, qzeros, scales = pack_awq(np.zeros((16, 8), int), np.zeros((2, 8), int), np.ones((2, 8)))
    with pytest.raises(ValueError, match="group size 16"):
        unpack_awq(qweight, qzeros, scales, 16)
