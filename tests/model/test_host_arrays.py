"""Aligned host arrays: a CPU device uses them in place; numpy's huge-page advice is off while a model loads."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxllm.model.host_arrays import (DEVICE_ALIGNMENT, aligned_as, aligned_concatenate, aligned_empty, is_aligned,
                                      small_pages)


@pytest.mark.parametrize("shape, dtype", [((3, 5), np.float32), ((1000, 17), np.float16), ((1, 1), np.int8)])
def test_aligned_arrays_start_on_the_boundary(shape, dtype):
    array = aligned_empty(shape, dtype)
    assert array.shape == shape and array.dtype == dtype and array.ctypes.data % DEVICE_ALIGNMENT == 0


def test_a_cpu_device_uses_an_aligned_array_in_place():
    host = aligned_as(np.arange(4096, dtype=np.float32), np.float32)
    placed = jax.device_put(host, jax.devices("cpu")[0])
    assert placed.unsafe_buffer_pointer() == host.ctypes.data  # shared, not copied
    np.testing.assert_array_equal(np.asarray(placed), np.arange(4096, dtype=np.float32))


def test_aligned_as_casts_or_keeps():
    source = np.arange(12, dtype=np.float64).reshape(3, 4)
    cast = aligned_as(source, np.float32)
    assert cast.dtype == np.float32 and is_aligned(cast) and np.array_equal(cast, source)
    assert aligned_as(cast, np.float32) is cast


def test_aligned_concatenate_equals_numpy():
    parts = [np.random.default_rng(i).standard_normal((i + 1, 3)).astype(np.float32) for i in range(3)]
    joined = aligned_concatenate(parts, axis=0)
    assert is_aligned(joined) and np.array_equal(joined, np.concatenate(parts, axis=0))


def test_small_pages_turns_numpys_advice_off_inside_and_restores_it():
    multiarray = np._core.multiarray
    before = multiarray._get_madvise_hugepage()
    with pytest.raises(RuntimeError), small_pages():
        assert multiarray._get_madvise_hugepage() is False
        raise RuntimeError
    assert multiarray._get_madvise_hugepage() == before
