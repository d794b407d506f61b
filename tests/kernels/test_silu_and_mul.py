"""The gated MLP's native SiLU-and-product kernel (pallas_kernels/silu_and_mul/cpu_kernel.cc) against its jnp
reference: bit-equal in bfloat16, on values from tiny to beyond exp's range, infinities and NaN, rows of any width;
and the model's forward with it equal to the forward without."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.model.kernels import REFERENCE
from jaxllm.model.layers import SILU_KERNEL_MIN_ROWS, gated_mlp
from pallas_kernels.silu_and_mul.cpu import silu_and_mul_cpu, silu_and_mul_error
from pallas_kernels.silu_and_mul.reference import gated_activation_reference

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel")
needs_build = pytest.mark.skipif(silu_and_mul_error() is not None, reason="no native build (see the test below)")


def _both(gate_up: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """The kernel on float32 sums, the reference on them rounded to bfloat16 (the model's projection output)."""
    got = np.asarray(jax.jit(silu_and_mul_cpu)(gate_up)).view(np.uint16)
    want = np.asarray(jax.jit(gated_activation_reference)(gate_up.astype(jnp.bfloat16))).view(np.uint16)
    return got, want


def _assert_bit_equal(got: np.ndarray, want: np.ndarray) -> None:
    nan = lambda bits: (bits & 0x7FFF) > 0x7F80  # bfloat16 NaN: any payload
    np.testing.assert_array_equal(nan(got), nan(want))
    np.testing.assert_array_equal(got[~nan(got)], want[~nan(want)])


def test_the_kernel_builds_here():
    assert silu_and_mul_error() is None


@needs_build
@pytest.mark.parametrize("rows,width", [(64, 1536), (3, 37), (1, 1), (17, 4096), (0, 8)])
def test_bit_equal_to_the_reference_on_every_scale(rows, width):
    rng = np.random.default_rng(rows * 10_000 + width)
    scale = rng.choice([1e-3, 0.1, 1.0, 5.0, 30.0, 100.0], size=(rows, 2 * width))
    gate_up = jnp.asarray(rng.standard_normal((rows, 2 * width)) * scale, jnp.float32)
    _assert_bit_equal(*_both(gate_up))


@needs_build
def test_extremes_infinities_and_nan():
    specials = np.array([0.0, -0.0, 1e-38, -1e-38, 87.0, -87.0, 88.5, -88.5, 89.0, -89.0, 100.0, -100.0, 3e38,
                         -3e38, np.inf, -np.inf, np.nan], np.float32)
    gate = np.repeat(specials, len(specials))  # every gate value beside every up value
    up = np.tile(specials, len(specials))
    gate_up = jnp.asarray(np.stack([gate, up]).reshape(1, -1), jnp.float32)
    _assert_bit_equal(*_both(gate_up))


@needs_build
def test_leading_axes_are_kept():
    gate_up = jnp.asarray(np.random.default_rng(1).standard_normal((2, 3, 10)), jnp.float32)
    got = silu_and_mul_cpu(gate_up)
    assert got.shape == (2, 3, 5) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16).reshape(6, 5),
                                  np.asarray(silu_and_mul_cpu(gate_up.reshape(6, 10))).view(np.uint16))


def test_only_float32_gate_up_of_even_width_is_taken():
    with pytest.raises(ValueError, match="float32 gate_up"):
        silu_and_mul_cpu(jnp.ones((2, 8), jnp.bfloat16))
    with pytest.raises(ValueError, match="float32 gate_up"):
        silu_and_mul_cpu(jnp.ones((2, 7), jnp.float32))


@needs_build
@pytest.mark.parametrize("rows", [SILU_KERNEL_MIN_ROWS, SILU_KERNEL_MIN_ROWS - 1])
def test_the_gated_mlp_with_the_kernel_is_the_mlp_without(rows):
    """From SILU_KERNEL_MIN_ROWS rows the kernel runs (fewer: XLA's fused op, cheaper there); either way the same."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, 64)), jnp.bfloat16)
    w_gate_up = jnp.asarray(rng.standard_normal((2 * 96, 64)) * 0.2, jnp.bfloat16)
    w_down = jnp.asarray(rng.standard_normal((64, 96)) * 0.2, jnp.bfloat16)
    native = dataclasses.replace(REFERENCE, silu_and_mul="cpu")
    want = jax.jit(lambda *a: gated_mlp(*a, REFERENCE))(x, w_gate_up, w_down)
    got = jax.jit(lambda *a: gated_mlp(*a, native))(x, w_gate_up, w_down)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    hlo = jax.jit(lambda *a: gated_mlp(*a, native)).lower(x, w_gate_up, w_down).as_text()
    assert ("jaxllm_silu_and_mul" in hlo) == (rows >= SILU_KERNEL_MIN_ROWS)
