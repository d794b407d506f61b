"""The native row argmax (pallas_kernels/argmax) against its jnp contract, `argmax_rows` (jnp.argmax): ties, rows of
-inf, NaN, infinities, every tail length of a 16-lane step, and the sampler with the kernel chosen."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.model.kernels import REFERENCE
from jaxllm.sampler import sample
from jaxllm.sampling_batch import SamplingRow, build_sampling_batch
from jaxllm.sampling_params import SamplingParams
from pallas_kernels.argmax.cpu import argmax_kernel_error, argmax_rows_cpu
from pallas_kernels.argmax.reference import argmax_rows

pytestmark = [pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel"),
              pytest.mark.skipif(argmax_kernel_error() is not None, reason=f"no native build: {argmax_kernel_error()}")]


def assert_matches_reference(x: np.ndarray):
    got = np.asarray(jax.jit(argmax_rows_cpu)(jnp.asarray(x)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.asarray(argmax_rows(jnp.asarray(x))))
    np.testing.assert_array_equal(got, np.argmax(x, axis=-1))


def test_ties_infinities_and_nan_as_jnp_argmax():
    x = np.random.RandomState(2).randint(-3, 4, size=(10, 70)).astype(np.float32)  # many ties at the maximum
    x[1] = -np.inf  # every token masked: index 0
    x[2, [5, 40]] = np.inf  # two infinite maxima: the first
    x[3, [7, 9]] = np.nan  # NaN counts as the largest: the first NaN
    x[4, 69] = 100.0  # the maximum in the masked tail of the last 16-lane step
    x[5, 66] = np.nan  # a NaN in the tail
    x[6, :] = 2.0  # all equal: 0
    x[7, 0] = -np.inf  # -inf first, the rest finite
    x[8] = -np.inf
    x[8, 33] = -1e30  # one finite value among -inf
    assert_matches_reference(x)
    assert list(np.asarray(argmax_rows_cpu(jnp.asarray(x)))[1:7]) == [0, 5, 7, 69, 66, 0]


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 31, 49152 + 3])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_random_rows_of_every_tail_length(rows, vocab):
    x = np.random.RandomState(rows * vocab).randn(rows, vocab).astype(np.float32)
    x[:, -1] = x.max(axis=-1) + 1.0 if vocab > 1 else x[:, -1]  # the answer in the last lane for some rows
    x[::2, 0] = x.max()  # and in the first for others
    assert_matches_reference(x)


def test_bad_operands_are_named():
    with pytest.raises(ValueError, match=r"float32 x \[R, V\]"):
        argmax_rows_cpu(jnp.zeros((2, 3), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"float32 x \[R, V\]"):
        argmax_rows_cpu(jnp.zeros((3,), jnp.float32))


def test_the_sampler_with_the_kernel_samples_what_it_does_without():
    rng = np.random.RandomState(0)
    logits = jnp.asarray(rng.randn(6, 5000).astype(np.float32) * 4)
    rows = [SamplingRow(SamplingParams(temperature=0.0), [1], [], rng_stream=0),
            SamplingRow(SamplingParams(temperature=0.9, seed=7), [1], [2, 3], rng_stream=1),
            SamplingRow(SamplingParams(temperature=1.0, top_k=20, seed=3), [1], [], rng_stream=2),
            SamplingRow(SamplingParams(temperature=0.0), [1], [], rng_stream=3),
            SamplingRow(SamplingParams(temperature=0.7, top_p=0.8), [1], [4], rng_stream=4),
            SamplingRow(SamplingParams(temperature=0.0), [1], [], rng_stream=5)]
    batch = build_sampling_batch(rows, 6, 5000)
    native = dataclasses.replace(REFERENCE, argmax="cpu")
    want = jax.jit(lambda l, b: sample(l, b, REFERENCE))(logits, batch)
    got = jax.jit(lambda l, b: sample(l, b, native))(logits, batch)
    np.testing.assert_array_equal(np.asarray(got.sampled_token_ids), np.asarray(want.sampled_token_ids))
    greedy = np.asarray(logits).argmax(-1)
    np.testing.assert_array_equal(np.asarray(got.sampled_token_ids)[[0, 3, 5]], greedy[[0, 3, 5]])
