"""Mixture-of-experts models (model/moe.py): the router against Hugging Face's own router modules on crafted logits
with ties; tensor parallelism (experts split on their intermediate axis) and expert parallelism (experts split
whole) at N = 2 and 4 give the logits of N = 1; each device holds E/N experts under expert parallelism, and a
sparse layer all-reduces twice as a dense one does; sizes that cannot split the experts are refused with the
valid ones listed."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from jaxllm import load_model
from jaxllm.config import ModelConfig
from jaxllm.model import select_kernels
from jaxllm.model import tensor_parallel as tp
from jaxllm.model.moe import route
from tests.model.test_families_tensor_parallel import logits_at
from tests.model.test_tensor_parallel import BLOCK_SIZE, LOGITS_TOLERANCE, NUM_BLOCKS, batches
from tests.tiny_models import MOE_FAMILIES

NUM_EXPERTS = 8

ROUTERS = {  # name -> (HF router module, whether it renormalizes the top-k)
    "mixtral": (MixtralTopKRouter(MixtralConfig(hidden_size=NUM_EXPERTS, num_local_experts=NUM_EXPERTS,
                                                num_experts_per_tok=3)), True),
    "qwen2_moe": (Qwen2MoeTopKRouter(Qwen2MoeConfig(hidden_size=NUM_EXPERTS, num_experts=NUM_EXPERTS,
                                                    num_experts_per_tok=3, norm_topk_prob=False)), False),
    "qwen3_moe_norm": (Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=NUM_EXPERTS, num_experts=NUM_EXPERTS,
                                                         num_experts_per_tok=3, norm_topk_prob=True)), True),
}


def hf_route(module, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids [T, k], weights [T, k]) of HF's router module given these router logits: its weight is the identity,
    so its input is its logits."""
    with torch.no_grad():
        module.weight.copy_(torch.eye(NUM_EXPERTS))
        _, weights, ids = module(torch.tensor(logits))
    return ids.numpy(), weights.float().numpy()


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_router_equals_hf_with_ties(name):
    module, normalize = ROUTERS[name]
    rng = np.random.default_rng(0)
    logits = np.concatenate([rng.integers(0, 3, size=(400, NUM_EXPERTS)),  # many ties, inside and across the k-th
                             rng.standard_normal((100, NUM_EXPERTS))]).astype(np.float32)
    want_ids, want_weights = hf_route(module, logits)
    ids, weights = (np.asarray(a) for a in route(jnp.asarray(logits), jnp.eye(NUM_EXPERTS), 3, normalize))
    np.testing.assert_allclose(weights, want_weights, rtol=1e-6, atol=0)  # the same k values, largest first
    probs = np.asarray(jnp.take_along_axis(jnp.asarray(logits), jnp.asarray(want_ids), axis=1))
    kth = np.sort(logits, axis=1)[:, -3]  # the k-th largest logit
    straddles = (logits == kth[:, None]).sum(1) > (np.sort(logits, axis=1)[:, -3:] == kth[:, None]).sum(1)
    # where no tie straddles the k-th place the choice is the same set; where one does, torch's order among the
    # equal ones is its partition's, jaxllm keeps the lower ids, and both chose experts of the same logits
    for row in range(len(logits)):
        if straddles[row]:
            assert sorted(logits[row, ids[row]]) == sorted(probs[row]), row
            tied = np.flatnonzero(logits[row] == kth[row])
            assert set(ids[row]) & set(tied) == set(tied[:len(set(ids[row]) & set(tied))]), row
        else:
            assert set(ids[row]) == set(want_ids[row]), row
    assert straddles.sum() > 50  # the crafted logits do exercise the ties that matter


def _parallel_logits(loaded, n: int, expert_parallel: bool):
    config = dataclasses.replace(loaded.config, expert_parallel=expert_parallel)
    return logits_at(dataclasses.replace(loaded, config=config), n)


@pytest.mark.slow
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_tensor_and_expert_parallel_equal_one_device(family, tiny_model_dir):
    loaded = load_model(tiny_model_dir(family)[0])
    want = logits_at(loaded, 1)
    for n, expert_parallel in [(2, False), (2, True), (4, False), (4, True)]:
        for got, expected in zip(_parallel_logits(loaded, n, expert_parallel), want, strict=True):
            np.testing.assert_allclose(got, expected, atol=LOGITS_TOLERANCE, rtol=0,
                                       err_msg=f"N = {n}, expert_parallel {expert_parallel}")


@pytest.mark.parametrize("n, expert_parallel", [(2, True), (4, True), (2, False)])
def test_each_device_holds_its_experts(n, expert_parallel, tiny_model_dir):
    loaded = load_model(tiny_model_dir("qwen2_moe")[0])
    config = dataclasses.replace(loaded.config, expert_parallel=expert_parallel)
    params = tp.shard_params(loaded.params, config, tp.make_mesh(n))
    e, i = config.num_experts, config.moe_intermediate_size
    for layer in params.layers:
        for shard in layer.w_experts_gate_up.addressable_shards:
            assert shard.data.shape == ((e // n, 2 * i, config.hidden_size) if expert_parallel else
                                        (e, 2 * i // n, config.hidden_size))
            assert shard.data.nbytes == layer.w_experts_gate_up.nbytes // n
        assert {s.data.shape[0] for s in layer.w_experts_down.addressable_shards} == \
            {e // n if expert_parallel else e}
        assert layer.router.addressable_shards[0].data.shape == (e, config.hidden_size)  # replicated
        assert layer.w_shared_down.addressable_shards[0].data.shape == \
            (config.hidden_size, config.shared_expert_intermediate_size // n)  # split like a dense MLP


def test_expert_counts_that_do_not_split_are_refused():
    config = ModelConfig(architecture="qwen3_moe", vocab_size=64, hidden_size=48, intermediate_size=48, num_layers=1,
                         num_heads=12, num_kv_heads=12, head_dim=4, num_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=48)
    tp.check_tp_size(config, 3, 8)  # each expert's 48 columns split in three
    with pytest.raises(ValueError, match=r"8 experts \(expert parallelism\).*valid sizes: 1, 2, 4$"):
        tp.check_tp_size(dataclasses.replace(config, expert_parallel=True), 3, 8)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_a_sparse_layer_all_reduces_twice_like_a_dense_one(expert_parallel, tiny_model_dir):
    """The experts' partial outputs ride the MLP's one all-reduce: no all-to-all, no gather of weights."""
    loaded = load_model(tiny_model_dir("qwen2_moe")[0])
    config = dataclasses.replace(loaded.config, expert_parallel=expert_parallel)
    mesh = tp.make_mesh(2)
    params = tp.shard_params(loaded.params, config, mesh)
    kv = tp.init_kv_cache(config, NUM_BLOCKS, BLOCK_SIZE, mesh=mesh)
    forward = tp.jit_forward(config, select_kernels(attention="reference"), mesh=mesh)
    text = forward.lower(params, kv, batches()[0]).compile().as_text()
    assert text.count(" all-reduce(") == 2 * config.num_layers
    assert " all-to-all(" not in text and " all-gather(" not in text
