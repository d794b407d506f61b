"""GGML tensor data -> float32 numpy, whole tensors at once, written into aligned memory (model/host_arrays).

The block formats llama.cpp writes for small models (Q8_0, Q4_0, Q4_1) and the plain float types are decoded here
in a few numpy operations over the whole tensor, straight into the output (no float32 temporary the size of the
tensor); the k-quants (Q4_K, Q6_K) go to the `gguf` package's decoder. Block layouts (ggml-common.h): Q8_0 = f16
scale, 32 x int8; Q4_0 = f16 scale, 16 bytes of 4-bit values (low nibbles are elements 0-15, high nibbles 16-31)
offset by 8; Q4_1 = f16 scale, f16 minimum, 16 bytes as Q4_0 with no offset. tests/loaders/test_gguf_dequant.py
checks each against the gguf package.
"""

from __future__ import annotations

import numpy as np

from jaxllm.model.host_arrays import aligned_as, aligned_empty
from jaxllm.optional_deps import GGUF, require


def dequantize(data: np.ndarray, type_name: str) -> np.ndarray:
    """`data` as gguf_file.GGUFTensor holds it -> float32 [..., row elements]."""
    if type_name in ("F32", "F16"):
        return aligned_as(data, np.float32)
    if type_name == "BF16":
        return aligned_as((data.view(np.uint16).astype(np.uint32) << 16).view(np.float32), np.float32)
    if type_name in _BLOCK_DECODERS:
        block_bytes, decode = _BLOCK_DECODERS[type_name]
        blocks = data.reshape(-1, block_bytes)  # [B, block bytes]
        out = aligned_empty((blocks.shape[0], 32), np.float32)  # [B, 32] values per block
        decode(blocks, out)
        return out.reshape(*data.shape[:-1], -1)
    require("gguf", GGUF)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    return aligned_as(gguf_dequantize(data, GGMLQuantizationType[type_name]), np.float32)


def _scales(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of each block -> float32 [B, 1]."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles_times(packed: np.ndarray, scale: np.ndarray, out: np.ndarray, offset: int = 0) -> None:
    """out [B, 32] = (the 4-bit values of packed [B, 16], low nibbles then high ones, less offset) x scale [B, 1]."""
    for half, values in enumerate((packed & 0x0F, packed >> 4)):
        np.multiply(values.view(np.int8) - np.int8(offset), scale, out=out[:, 16 * half:16 * (half + 1)])


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    np.multiply(blocks[:, 2:].view(np.int8), _scales(blocks, 0), out=out)


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    _nibbles_times(blocks[:, 2:], _scales(blocks, 0), out, offset=8)


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    _nibbles_times(blocks[:, 4:], _scales(blocks, 0), out)
    out += _scales(blocks, 2)


_BLOCK_DECODERS = {"Q8_0": (34, _q8_0), "Q4_0": (18, _q4_0), "Q4_1": (20, _q4_1)}
