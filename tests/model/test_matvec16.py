"""The dense dots' CPU dispatch (Kernels.matvec16): "two_rows" (a one-row dot with a 16-bit dense weight as a two-row
product) and "native" (the CPU choice where the native skinny kernel builds: a dense 2-D weight's dot with at most
8 rows, save a one-row dot with a float32 weight) equal the plain dot (the jnp reference, "direct"), alone and in a
whole batch-1 forward; which dots each takes is read from the lowered program."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params, select_kernels
from jaxllm.model import weights
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.kernels import REFERENCE
from pallas_kernels.skinny_matmul.cpu import KERNEL as SKINNY, MAX_ROWS, skinny_kernel_error

TWO_ROWS = dataclasses.replace(REFERENCE, matvec16="two_rows")
NATIVE = dataclasses.replace(REFERENCE, matvec16="native")
ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the native skinny kernel is a CPU kernel")
CONFIG = ModelConfig(architecture="llama", vocab_size=96, hidden_size=64, intermediate_size=160, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16)


@pytest.mark.parametrize("x_shape", [(1, 64), (64,), (1, 1, 64)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_two_rows_equals_the_plain_dot(x_shape, dtype):
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, x_shape, dtype)
    w = jax.random.normal(kw, (96, 64), dtype)  # [N, K]
    got = jax.jit(lambda x, w: weights.dot(x, w, TWO_ROWS))(x, w)
    want = weights.dense_dot(x, w)
    assert got.shape == want.shape == (*x_shape[:-1], 96) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)  # f32 sums, any order


def test_only_one_row_of_a_16_bit_weight_takes_it():
    x1, x4 = jnp.ones((1, 64), jnp.bfloat16), jnp.ones((4, 64), jnp.bfloat16)
    w16, w32 = jnp.ones((8, 64), jnp.bfloat16), jnp.ones((8, 64), jnp.float32)

    def barriers(x, w):
        return jax.jit(lambda x, w: weights.dot(x, w, TWO_ROWS)).lower(x, w).as_text().count("optimization_barrier")

    assert barriers(x1, w16) == 1
    assert barriers(x4, w16) == 0 and barriers(x1.astype(jnp.float32), w32) == 0
    assert barriers(x1, jnp.ones((3, 8, 64), jnp.bfloat16)) == 0  # stacked weights [E, N, K]: the plain dot


def skinny_calls(x, w) -> int:
    """How many skinny-kernel calls the "native" dispatch of dot(x, w) lowers to."""
    return jax.jit(lambda x, w: weights.dot(x, w, NATIVE)).lower(x, w).as_text().count(f"custom_call @{SKINNY.name}(")


@ON_CPU
def test_which_dots_take_the_native_kernel():
    w16, w32 = jnp.ones((8, 64), jnp.bfloat16), jnp.ones((8, 64), jnp.float32)
    for rows in (1, 5, MAX_ROWS):
        assert skinny_calls(jnp.ones((rows, 64), jnp.bfloat16), w16) == 1
        assert skinny_calls(jnp.ones((rows, 64), jnp.float32), w16) == 1
    assert skinny_calls(jnp.ones((1, 1, 64), jnp.bfloat16), w16) == 1  # leading axes of one row in all
    for rows in (2, 5, MAX_ROWS):
        assert skinny_calls(jnp.ones((rows, 64), jnp.float32), w32) == 1
    assert skinny_calls(jnp.ones((1, 64), jnp.float32), w32) == 0  # XLA's one-row float32 dot: already as fast
    assert skinny_calls(jnp.ones((MAX_ROWS + 1, 64), jnp.bfloat16), w16) == 0  # above the bound
    assert skinny_calls(jnp.ones((1, 64), jnp.bfloat16), jnp.ones((3, 8, 64), jnp.bfloat16)) == 0  # [E, N, K]
    assert skinny_calls(jnp.ones((1, 64), jnp.float16), jnp.ones((8, 64), jnp.float16)) == 0  # not its dtype


@ON_CPU
def test_weight_formats_do_not_take_the_native_kernel():
    k, n, group = 64, 8, 32
    awq = AWQWeight(qweight=jnp.zeros((k // 8, n), jnp.int32), zeros=jnp.zeros((k // group, n), jnp.int8),
                    scales=jnp.ones((k // group, n), jnp.float16))  # a packed int4 W [N, K]
    assert skinny_calls(jnp.ones((1, k), jnp.bfloat16), awq) == 0


@ON_CPU
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_native_equals_the_plain_dot(rows, dtype):
    kx, kw = jax.random.split(jax.random.key(rows))
    x = jax.random.normal(kx, (rows, 64), dtype)
    w = jax.random.normal(kw, (96, 64), dtype)  # [N, K]
    got = jax.jit(lambda x, w: weights.dot(x, w, NATIVE))(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(weights.dense_dot(x, w)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_tokens", [1, 5])
def test_cpu_kernels_choice_and_a_forward_of_one_sequence_is_unchanged(num_tokens):
    cpu_choice = "native" if skinny_kernel_error() is None else "two_rows"
    assert select_kernels("reference").matvec16 == ("direct" if jax.default_backend() == "gpu" else cpu_choice)
    params = random_params(CONFIG, jax.random.key(1), jnp.bfloat16)
    chunk = SequenceChunk(list(range(5, 5 + num_tokens)), 20, [2, 3], want_logits="all")
    batch = build_step_batch([chunk], 16, num_tokens=num_tokens, num_seqs=1, max_blocks=2)
    logits = {}
    for kernels in (REFERENCE, TWO_ROWS, NATIVE) if skinny_kernel_error() is None else (REFERENCE, TWO_ROWS):
        kv = init_kv_cache(CONFIG, 8, 16, jnp.bfloat16)
        logits[kernels.matvec16], _ = jit_forward(CONFIG, kernels)(params, kv, batch)
    direct = np.asarray(logits["direct"])
    assert direct.shape == (num_tokens, CONFIG.vocab_size)
    for name in set(logits) - {"direct"}:
        # bfloat16 activations: a last-bit difference in a float32 sum can round an activation to its bf16
        # neighbour (relative 2^-8), and that propagates; within bf16's precision of the logits' scale, and the
        # same argmax
        np.testing.assert_allclose(np.asarray(logits[name]), direct, rtol=0, atol=1e-2 * np.abs(direct).max())
        assert (np.argmax(logits[name], -1) == np.argmax(direct, -1)).all()
