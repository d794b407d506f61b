"""One-row dots with 16-bit dense weights as two-row products (Kernels.matvec16 "two_rows", the CPU choice): equal
to the plain dot (the jnp reference, "direct"), alone and in a whole batch-1 forward."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params, select_kernels
from jaxllm.model import weights
from jaxllm.model.kernels import REFERENCE

TWO_ROWS = dataclasses.replace(REFERENCE, matvec16="two_rows")
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


def test_cpu_kernels_choose_two_rows_and_a_batch_1_forward_is_unchanged():
    assert select_kernels("reference").matvec16 == ("direct" if jax.default_backend() == "gpu" else "two_rows")
    params = random_params(CONFIG, jax.random.key(1), jnp.bfloat16)
    batch = build_step_batch([SequenceChunk([5], 20, [2, 3])], 16, num_tokens=1, num_seqs=1, max_blocks=2)
    logits = {}
    for kernels in (REFERENCE, TWO_ROWS):
        kv = init_kv_cache(CONFIG, 8, 16, jnp.bfloat16)
        logits[kernels.matvec16], _ = jit_forward(CONFIG, kernels)(params, kv, batch)
    direct = np.asarray(logits["direct"])
    # bfloat16 activations: a last-bit difference in a float32 sum can round an activation to its bf16 neighbour
    # (relative 2^-8), and that propagates; within bf16's precision of the logits' scale, and the same argmax
    np.testing.assert_allclose(np.asarray(logits["two_rows"]), direct, rtol=0, atol=1e-2 * np.abs(direct).max())
    assert (np.argmax(logits["two_rows"], -1) == np.argmax(direct, -1)).all()
