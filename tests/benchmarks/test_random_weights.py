"""Random weights made on the device (dense, int4 AWQ, and mixture-of-experts dense or int4) and the bytes a decode
step must read (a MoE layer's routed experts only, against a hand count)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.benchmarks.model_presets import model_preset
from jaxllm.benchmarks.random_weights import device_random_awq_params, device_random_params
from jaxllm.benchmarks.step_bytes import decode_step_bytes
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.kernels import REFERENCE, Kernels
from jaxllm.model.params import LINEAR_FIELDS, abstract_params, param_bytes
from pallas_kernels.awq_matmul import dequantize

CONFIG = model_preset("tiny")  # hidden 128, intermediate 256: group 128 divides every input size


def _shapes(tree):
    return jax.tree.map(lambda leaf: (leaf.shape, jnp.dtype(leaf.dtype)), tree)


def test_dense_params_have_the_model_structure_and_distinct_layers():
    params = device_random_params(CONFIG, seed=3, dtype=jnp.bfloat16)
    assert _shapes(params) == _shapes(abstract_params(CONFIG, jnp.bfloat16))
    first, second = params.layers
    assert not np.array_equal(np.asarray(first.w_qkv), np.asarray(second.w_qkv))
    assert np.all(np.asarray(first.attn_norm) == 1) and np.all(np.asarray(params.final_norm) == 1)
    std = float(jnp.std(first.w_gate_up.astype(jnp.float32)))
    assert 0.015 < std < 0.025
    again = device_random_params(CONFIG, seed=3, dtype=jnp.bfloat16)
    assert np.array_equal(np.asarray(again.lm_head), np.asarray(params.lm_head))  # seeded


@pytest.mark.slow
def test_awq_params_pack_every_linear_and_share_the_base_arrays():
    base = device_random_params(CONFIG, dtype=jnp.bfloat16)
    params = device_random_awq_params(CONFIG, seed=1, group_size=128, base=base)
    assert params.embed is base.embed and params.lm_head is base.lm_head
    for layer in params.layers:
        for field in LINEAR_FIELDS:
            weight = getattr(layer, field)
            dense = getattr(base.layers[0], field)
            assert isinstance(weight, AWQWeight) and weight.shape == dense.shape and weight.group_size == 128
            assert weight.scales.dtype == jnp.bfloat16  # the activations' dtype: the kernel's fast path
        w = np.asarray(dequantize(layer.w_down.packed, jnp.float32))  # [K, N]
        assert w.shape == (CONFIG.intermediate_size, CONFIG.hidden_size) and 0.005 < w.std() < 0.1
    f16 = device_random_awq_params(CONFIG, scale_dtype=jnp.float16, base=base)
    assert f16.layers[0].wo.scales.dtype == jnp.float16


@pytest.mark.slow
def test_awq_params_run_through_the_forward():
    params = device_random_awq_params(CONFIG, group_size=64)
    kv = init_kv_cache(CONFIG, 4, 16, jnp.bfloat16)
    batch = build_step_batch([SequenceChunk([5, 6, 7], 0, [1])], 16)
    logits, _ = jit_forward(CONFIG, REFERENCE)(params, kv, batch)  # AWQ on CPU: its jnp reference
    assert logits.shape == (1, CONFIG.vocab_size) and np.isfinite(np.asarray(logits)).all()


def test_a_group_size_that_does_not_divide_the_inputs_is_refused():
    with pytest.raises(ValueError, match="multiple of the group size 256"):
        device_random_awq_params(CONFIG, group_size=256)


def test_decode_step_bytes_count_weights_once_and_kv_per_token():
    params = abstract_params(CONFIG, jnp.bfloat16)  # untied: the embedding table is read one row per token
    kv_per_token = 2 * CONFIG.num_layers * CONFIG.num_kv_heads * CONFIG.head_dim * 2
    embed = CONFIG.vocab_size * CONFIG.hidden_size * 2
    one = decode_step_bytes(params, CONFIG, 1, 1000, jnp.bfloat16)
    assert one == {"weights": param_bytes(params) - embed + CONFIG.hidden_size * 2, "kv": 1000 * kv_per_token,
                   "total": one["weights"] + one["kv"]}
    four = decode_step_bytes(params, CONFIG, 4, 1000, jnp.bfloat16)
    assert four["weights"] - one["weights"] == 3 * CONFIG.hidden_size * 2 and four["kv"] == 4 * one["kv"]
    tied_config = dataclasses.replace(CONFIG, tie_word_embeddings=True)
    tied = abstract_params(tied_config, jnp.bfloat16)  # the table is the LM head: read whole
    assert decode_step_bytes(tied, tied_config, 1, 0, jnp.bfloat16)["weights"] == param_bytes(tied)
    int4 = decode_step_bytes(device_random_awq_params(CONFIG), CONFIG, 1, 1000, jnp.bfloat16)
    assert int4["weights"] < one["weights"] / 2 and int4["kv"] == one["kv"]


TINY_MOE = model_preset("tiny-moe")  # H 64; layer 0: 8 experts of width 32, k = 2, shared 48; layer 1 dense 128


def test_decode_step_bytes_read_the_routed_experts_of_a_moe_layer():
    params = abstract_params(TINY_MOE, jnp.bfloat16)
    attention = ((4 + 2 * 2) * 16 * 64 + 64 * 64 + 2 * 64) * 2  # q|k|v, o and the two norms of a layer, bf16
    router_and_shared = (8 * 64 + 96 * 64 + 64 * 48 + 64) * 2  # router, shared gate|up and down, shared gate
    dense_mlp = (256 * 64 + 64 * 128) * 2
    one_expert = (64 * 64 + 64 * 32) * 2  # its gate|up [2I, H] and down [H, I]
    final_norm, lm_head, embed_row = 64 * 2, 256 * 64 * 2, 64 * 2  # untied: the head whole, a table row a token
    for batch_size, experts in [(1, 2), (3, 6), (4, 8), (16, 8)]:  # min(E, batch * k) distinct experts
        expected = (2 * attention + router_and_shared + dense_mlp + final_norm + lm_head + batch_size * embed_row
                    + experts * one_expert)
        assert decode_step_bytes(params, TINY_MOE, batch_size, 0, jnp.bfloat16)["weights"] == expected, batch_size
    all_experts = decode_step_bytes(params, TINY_MOE, 4, 0, jnp.bfloat16)["weights"]  # every weight but the table
    assert all_experts == param_bytes(params) - 256 * 64 * 2 + 4 * embed_row


def test_moe_params_have_each_layers_structure_and_distinct_experts():
    params = device_random_params(TINY_MOE, seed=2, dtype=jnp.float32)
    assert _shapes(params) == _shapes(abstract_params(TINY_MOE, jnp.float32))  # layer 0 sparse, layer 1 dense
    sparse, dense = params.layers
    assert sparse.w_experts_gate_up.shape == (8, 2 * 32, 64) and sparse.w_experts_down.shape == (8, 64, 32)
    assert sparse.router.shape == (8, 64) and sparse.w_shared_gate_up.shape == (2 * 48, 64)
    assert sparse.w_gate_up is None and dense.w_experts_gate_up is None and dense.w_down.shape == (64, 128)
    experts = np.asarray(sparse.w_experts_down)  # [E, H, I]
    assert not np.array_equal(experts[0], experts[1]) and 0.015 < experts.std() < 0.025
    assert np.all(np.asarray(sparse.mlp_norm) == 1)


def test_moe_params_run_through_the_forward():
    params = device_random_params(TINY_MOE, dtype=jnp.float32)
    kv = init_kv_cache(TINY_MOE, 4, 16, jnp.float32)
    batch = build_step_batch([SequenceChunk([5, 6, 7], 0, [1])], 16)
    logits, _ = jit_forward(TINY_MOE, REFERENCE)(params, kv, batch)
    assert logits.shape == (1, TINY_MOE.vocab_size) and np.isfinite(np.asarray(logits)).all()


def test_random_awq_moe_params_pack_the_experts_and_run_through_the_forward():
    """Expert stacks int4 with a leading [E] (each expert drawn apart), the shared expert int4, the router dense; the
    pallas MoE kernels (interpret mode) give the reference's logits on them."""
    params = device_random_awq_params(TINY_MOE, group_size=16, dtype=jnp.float32)
    sparse, dense = params.layers
    assert isinstance(sparse.w_experts_gate_up, AWQWeight) and sparse.w_experts_gate_up.shape == (8, 2 * 32, 64)
    assert sparse.w_experts_down.qweight.shape == (8, 32 // 8, 64) and sparse.w_experts_down.zeros.shape == (8, 2, 64)
    assert isinstance(sparse.w_shared_down, AWQWeight) and not isinstance(sparse.router, AWQWeight)
    assert isinstance(dense.w_down, AWQWeight) and dense.w_experts_down is None
    words = np.asarray(sparse.w_experts_down.qweight)
    assert not np.array_equal(words[0], words[1])
    batch = build_step_batch([SequenceChunk([5, 6, 7], 0, [1])], 16)
    want, _ = jit_forward(TINY_MOE, REFERENCE)(params, init_kv_cache(TINY_MOE, 4, 16, jnp.float32), batch)
    got, _ = jit_forward(TINY_MOE, Kernels(moe="pallas", interpret=True))(
        params, init_kv_cache(TINY_MOE, 4, 16, jnp.float32), batch)  # the pool is donated: a fresh one
    assert np.isfinite(np.asarray(want)).all() and np.abs(np.asarray(want)).max() > 0
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-4 * np.abs(np.asarray(want)).max())
