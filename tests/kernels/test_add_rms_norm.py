"""The native residual add and RMS norm (pallas_kernels/add_rms_norm/cpu_kernel.cc): against a strict oracle (every
bfloat16 rounding of Llama's order, float64 mean), against the jnp reference (which XLA computes with excess
precision: neither the sum it norms nor the normed sum is rounded before the next step, so within two bfloat16
steps), on widths that are not multiples of
16, zero rows and huge values; bad inputs refused; and the model's forward with it close to the forward without,
the kernel called where the dtype and the norm's order allow."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params
from jaxllm.model.kernels import REFERENCE
from pallas_kernels.add_rms_norm.cpu import add_rms_norm_cpu, add_rms_norm_error
from pallas_kernels.add_rms_norm.reference import add_rms_norm_reference

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel")
needs_build = pytest.mark.skipif(add_rms_norm_error() is not None, reason="no native build (see the test below)")
FUSED = dataclasses.replace(REFERENCE, add_rms_norm="cpu")
EPS = 1e-5


def _bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def _oracle(x: np.ndarray, delta: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Llama's order, every rounding explicit: sum = bf16(x + bf16(delta)), normed = bf16(w * bf16(sum * r))."""
    total = _bf16(x.astype(np.float32) + _bf16(delta))
    scale = (1.0 / np.sqrt((total.astype(np.float64) ** 2).mean(-1, keepdims=True) + EPS)).astype(np.float32)
    return total, _bf16(weight.astype(np.float32) * _bf16(total * scale))


def _steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many bfloat16 steps apart a and b are (values of one sign, as bfloat16 bit patterns)."""
    bits = lambda v: np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).view(np.int16).astype(np.int32)
    return np.abs(bits(a) - bits(b))


def _inputs(rows: int, width: int, seed: int, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((rows, width)) * scale, jnp.bfloat16)
    delta = jnp.asarray(rng.standard_normal((rows, width)) * 3 * scale, jnp.float32)
    weight = jnp.asarray(1 + 0.1 * rng.standard_normal(width), jnp.bfloat16)
    return x, delta, weight


def _kernel(x, delta, weight):
    total, normed = jax.jit(add_rms_norm_cpu, static_argnums=3)(x, delta, weight, EPS)
    return np.asarray(total, np.float32), np.asarray(normed, np.float32)


def test_the_kernel_builds_here():
    assert add_rms_norm_error() is None


@needs_build
@pytest.mark.parametrize("rows,width,scale", [(64, 576, 1.0), (1, 576, 1.0), (3, 20, 1.0), (513, 1024, 1.0),
                                              (8, 33, 1e-3), (8, 64, 300.0), (0, 16, 1.0)])
def test_equal_to_the_strict_oracle(rows, width, scale):
    x, delta, weight = _inputs(rows, width, rows * 1000 + width, scale)
    total, normed = _kernel(x, delta, weight)
    want_total, want_normed = _oracle(np.asarray(x, np.float32), np.asarray(delta), np.asarray(weight, np.float32))
    np.testing.assert_array_equal(total, want_total)
    # the kernel's float32 mean may differ from the float64 one in its last bit: at most a rare one-step rounding
    steps = _steps(normed, want_normed)
    assert steps.max(initial=0) <= 1 and (steps > 0).mean() <= 1e-3 if steps.size else True


@needs_build
def test_within_two_bfloat16_steps_of_the_jnp_reference():
    x, delta, weight = _inputs(64, 576, 7)
    total, normed = _kernel(x, delta, weight)
    want_total, want_normed = jax.jit(add_rms_norm_reference, static_argnums=3)(x, delta, weight, EPS)
    np.testing.assert_array_equal(total, np.asarray(want_total, np.float32))
    assert _steps(normed, want_normed).max() <= 2  # the reference skips two of the kernel's roundings


@needs_build
def test_a_zero_row_norms_to_zero_and_overflow_is_inf():
    x = jnp.asarray([[0.0] * 16, [3e38] * 16], jnp.bfloat16)
    delta = jnp.asarray([[0.0] * 16, [3e38] * 16], jnp.float32)
    total, normed = _kernel(x, delta, jnp.ones(16, jnp.bfloat16))
    assert np.all(total[0] == 0) and np.all(normed[0] == 0)
    assert np.all(np.isinf(total[1]))


@pytest.mark.parametrize("x,delta,weight", [
    (jnp.ones((2, 8), jnp.float32), jnp.ones((2, 8), jnp.float32), jnp.ones(8, jnp.bfloat16)),  # x not bfloat16
    (jnp.ones((2, 8), jnp.bfloat16), jnp.ones((2, 8), jnp.bfloat16), jnp.ones(8, jnp.bfloat16)),  # delta rounded
    (jnp.ones((2, 8), jnp.bfloat16), jnp.ones((2, 9), jnp.float32), jnp.ones(8, jnp.bfloat16)),  # shapes differ
    (jnp.ones((2, 8), jnp.bfloat16), jnp.ones((2, 8), jnp.float32), jnp.ones(9, jnp.bfloat16)),  # weight width
    (jnp.ones((8,), jnp.bfloat16), jnp.ones((8,), jnp.float32), jnp.ones(8, jnp.bfloat16)),  # not [T, H]
])
def test_inputs_outside_the_contract_are_refused(x, delta, weight):
    with pytest.raises(ValueError, match=r"x \[T, H\] bfloat16, delta \[T, H\] float32 and weight \[H\]"):
        add_rms_norm_cpu(x, delta, weight, EPS)


def _config(**overrides) -> ModelConfig:
    fields = dict(architecture="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=3,
                  num_heads=4, num_kv_heads=2, head_dim=16)
    return ModelConfig(**{**fields, **overrides})


def _forward(config, kernels, dtype):
    params = random_params(config, jax.random.key(0), dtype, scale=0.1)
    batch = build_step_batch([SequenceChunk([5, 90, 33, 2, 7, 11], 0, [1]), SequenceChunk([64], 7, [2])], 8,
                             num_tokens=8)
    args = (params, init_kv_cache(config, 4, 8, dtype), batch)
    logits, _ = jit_forward(config, kernels)(*args)
    return np.asarray(logits), jit_forward(config, kernels).lower(*args).as_text()


@needs_build
@pytest.mark.parametrize("architecture,dtype,fused", [("llama", jnp.bfloat16, True), ("llama", jnp.float32, False),
                                                      ("gemma2", jnp.bfloat16, False)])
def test_the_forward_with_the_kernel_is_close_to_the_forward_without(architecture, dtype, fused):
    """A bfloat16 Llama-style model runs the kernel (the layer's program holds 2 calls, the final norm 1); float32
    models and Gemma's norm order keep jnp, so their forward is the reference's bit for bit."""
    config = _config(architecture=architecture)
    got, hlo = _forward(config, FUSED, dtype)
    want, _ = _forward(config, REFERENCE, dtype)
    assert hlo.count("jaxllm_add_rms_norm") == (3 if fused else 0)
    if fused:
        np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)
        assert (got.argmax(-1) == want.argmax(-1)).all()
    else:
        np.testing.assert_array_equal(got, want)
