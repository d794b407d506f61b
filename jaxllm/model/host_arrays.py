"""Host arrays that a CPU device can use in place.

jax.device_put on a CPU device shares a numpy array's memory, instead of copying it, when the data starts on a
64-byte boundary; numpy's own large allocations start 16 bytes past a page. Loaders build every weight in such
memory, so placing a model on the CPU touches its bytes once, not twice (on these machines a first touch of fresh
memory costs about as much as the copy: benchmarks/RESULTS.md, start-up). While a model loads, numpy asks for
no transparent huge pages (small_pages).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

DEVICE_ALIGNMENT = 64  # bytes


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialized array whose data starts on a DEVICE_ALIGNMENT boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + DEVICE_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % DEVICE_ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def is_aligned(array: np.ndarray) -> bool:
    return array.flags.c_contiguous and array.ctypes.data % DEVICE_ALIGNMENT == 0


def aligned_as(array: np.ndarray, dtype) -> np.ndarray:
    """`array` cast to `dtype` in aligned memory: itself when it already is both."""
    if array.dtype == np.dtype(dtype) and is_aligned(array):
        return array
    out = aligned_empty(array.shape, dtype)
    out[...] = array
    return out


def aligned_concatenate(parts: list[np.ndarray], axis: int) -> np.ndarray:
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    return np.concatenate(parts, axis=axis, out=aligned_empty(tuple(shape), np.result_type(*parts)))


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """numpy advises no transparent huge pages for its allocations inside the block. Where the kernel's THP
    defrag setting is "madvise" (the default of many distributions), the first touch of advised memory compacts
    memory synchronously: the default model's weights loaded in 1.2-1.8 s with the advice and 0.7 s without, and
    decoding was no slower (benchmarks/RESULTS.md, start-up)."""
    multiarray = getattr(getattr(np, "_core", None) or np.core, "multiarray", None)
    setter = getattr(multiarray, "_set_madvise_hugepage", None)  # numpy's own switch (not public API)
    if setter is None:
        yield
        return
    previous = setter(False)
    try:
        yield
    finally:
        setter(previous)
