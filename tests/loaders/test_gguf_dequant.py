"""gguf_dequant decodes every block type it handles bit for bit as the gguf package does, into aligned memory."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize

from jaxllm.loaders.gguf_dequant import dequantize
from jaxllm.model.host_arrays import is_aligned


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.BF16, Q.F16, Q.F32])
def test_block_types_equal_the_gguf_package(qtype):
    rng = np.random.default_rng(int(qtype))
    weights = (rng.standard_normal((48, 256)) * rng.uniform(0.01, 4.0, (48, 1))).astype(np.float32)
    data = quantize(weights, qtype)
    ours = dequantize(data, qtype.name)
    reference = gguf_dequantize(data, qtype).astype(np.float32)
    assert ours.dtype == np.float32 and ours.shape == reference.shape == (48, 256)
    np.testing.assert_array_equal(ours, reference)
    assert is_aligned(ours)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_k_quants_go_to_the_gguf_package(qtype):
    block_bytes = {Q.Q4_K: 144, Q.Q6_K: 210}[qtype]
    data = np.random.default_rng(0).integers(0, 256, (4, block_bytes), dtype=np.uint8)
    data[:, :4] = np.frombuffer(np.float16([0.01, 0.001]).tobytes(), np.uint8)  # finite scales
    if qtype == Q.Q6_K:
        data[:, -2:] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    np.testing.assert_array_equal(dequantize(data, qtype.name), gguf_dequantize(data, qtype).astype(np.float32))
