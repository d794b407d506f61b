"""bfloat16 weights on CPU, held as their bits (jaxllm/model/bf16_bits_weight.py).

XLA:CPU turns the layer scan's bfloat16 weight slices into a float32 conversion of every layer's weights at every
step; held as uint16 bits they are sliced as integers. The forward is unchanged (same logits as dense bfloat16
weights), the compiled step converts no stacked weight, and checkpoints still hold the dense weights.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.loaders import load_checkpoint, save_checkpoint
from jaxllm.loaders.place import place_params
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params
from jaxllm.model.bf16_bits_weight import BFloat16Bits, dense_weights, hold_as_bits
from jaxllm.model.params import LINEAR_FIELDS

CONFIG = ModelConfig(architecture="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=3,
                     num_heads=4, num_kv_heads=2, head_dim=16)
ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU placement")


def _bf16_host_params():
    params = random_params(CONFIG, jax.random.key(0), jnp.bfloat16, scale=0.1)
    return jax.tree.map(np.asarray, params)


def _step(forward, params):
    batch = build_step_batch([SequenceChunk(list(range(1, 12)), 0, [1]), SequenceChunk([5, 6, 7], 0, [2])], 16,
                             num_tokens=16, num_seqs=2, max_blocks=1)
    return forward(params, init_kv_cache(CONFIG, 4, 16, jnp.bfloat16), batch)[0]


def test_only_dense_bfloat16_linears_become_bits():
    params = _bf16_host_params()
    held = hold_as_bits(params)
    for field in LINEAR_FIELDS:
        w = getattr(held.layers, field)
        assert isinstance(w, BFloat16Bits) and w.bits.dtype == np.uint16 and w.shape == getattr(params.layers,
                                                                                                  field).shape
    assert held.layers.attn_norm.dtype == jnp.bfloat16 and held.embed.dtype == jnp.bfloat16
    f32 = jax.tree.map(lambda a: a.astype(np.float32), params)
    assert hold_as_bits(f32).layers.w_qkv is f32.layers.w_qkv
    back = dense_weights(held)
    for field in LINEAR_FIELDS:
        np.testing.assert_array_equal(getattr(back.layers, field), getattr(params.layers, field))


@ON_CPU
def test_bits_forward_equals_the_dense_forward_and_converts_no_stacked_weight():
    params = _bf16_host_params()
    placed = place_params(params, CONFIG)
    assert isinstance(placed.layers.w_gate_up, BFloat16Bits)
    forward = jit_forward(CONFIG, attention="reference")
    dense = jax.tree.map(jnp.asarray, params)
    np.testing.assert_array_equal(np.asarray(_step(forward, placed)), np.asarray(_step(forward, dense)))

    kv = init_kv_cache(CONFIG, 4, 16, jnp.bfloat16)
    batch = build_step_batch([SequenceChunk([1, 2, 3], 0, [1])], 16, num_tokens=16, num_seqs=2, max_blocks=1)
    hlo = forward.lower(placed, kv, batch).compile().as_text()
    stacked = f"f32[{CONFIG.num_layers},{2 * CONFIG.intermediate_size},{CONFIG.hidden_size}]"
    assert not re.search(re.escape(stacked) + r"\S* (fusion|convert)\(", hlo), "w_gate_up converted to float32"
    dense_hlo = forward.lower(dense, kv, batch).compile().as_text()
    assert re.search(re.escape(stacked) + r"\S* (fusion|convert)\(", dense_hlo), \
        "dense bfloat16 weights no longer convert: the bits format may be unneeded"


@ON_CPU
def test_a_checkpoint_of_a_cpu_model_holds_dense_weights(tmp_path):
    placed = place_params(_bf16_host_params(), CONFIG)
    save_checkpoint(tmp_path / "ckpt", CONFIG, placed)
    _, restored = load_checkpoint(tmp_path / "ckpt")
    assert restored.layers.w_qkv.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(restored.layers.w_qkv), np.asarray(placed.layers.w_qkv.dense()))
