"""Each tensor read from a model file is checked before it is used: a floating-point dtype and finite values.

A NaN or an infinity in a weight reaches every logit of every request; an integer tensor where a weight belongs is
a file that is not what it claims to be (packed quantized formats check their own integer tensors). No supported
checkpoint carries either, so both are refused, naming the file and the tensor.
"""

from __future__ import annotations

import numpy as np

from jaxllm.errors import ModelLoadError

# dtype name -> (unsigned int of its size, exponent mask): a value is NaN or infinite iff its exponent bits are all
# ones. Tested on the bits, which is as fast for bfloat16 and float16 as for float32 (np.isfinite is ~10x slower).
_EXPONENT_BITS = {"float16": (np.uint16, 0x7C00), "bfloat16": (np.uint16, 0x7F80),
                  "float32": (np.uint32, 0x7F800000), "float64": (np.uint64, 0x7FF0000000000000)}
FLOAT_DTYPES = tuple(_EXPONENT_BITS)
_CHUNK = 1 << 22  # elements tested at once: bounds the temporary arrays


def check_weight(array: np.ndarray, name: str, source: object) -> np.ndarray:
    """`array`, unchanged; ModelLoadError naming `source` and tensor `name` when it is not a floating-point array
    of finite values."""
    dtype = np.dtype(array.dtype).name
    if dtype not in _EXPONENT_BITS:
        raise ModelLoadError(source, f"tensor {name!r} is {dtype}: weights must be floating point "
                             f"({', '.join(FLOAT_DTYPES)})")
    if not all_finite(array):
        raise ModelLoadError(source, f"tensor {name!r} holds NaN or infinite values")
    return array


def all_finite(array: np.ndarray) -> bool:
    """Whether every value of a floating-point array is finite."""
    uint, mask = _EXPONENT_BITS[np.dtype(array.dtype).name]
    bits = np.ravel(array).view(uint)
    mask = uint(mask)
    return not any(np.any(bits[i:i + _CHUNK] & mask == mask) for i in range(0, bits.size, _CHUNK))
