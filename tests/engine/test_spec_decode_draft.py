"""Draft-model speculative decoding: outputs identical to plain decoding, the draft's pool and state released,
nothing compiled after warm-up, refusals naming both models.

The draft's proposals are greedy (deterministic given the context), so verification keeps every request's
output what plain decoding generates, greedy or seeded (spec_decode/rejection.py): the tests compare whole
random workloads both ways, with the target as its own draft and with a smaller draft."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

import jax

from jaxllm.compile_counter import CompileCounter
from jaxllm.engine.args import ACTIVATION_RESERVE_FRACTION, EngineArgs, kv_block_bytes_per_device
from jaxllm.engine.engine import LLMEngine
from jaxllm.loaders import load_host_model
from jaxllm.model import kernels
from jaxllm.sampling_batch import logit_state_bytes
from jaxllm.sampling_params import SamplingParams
from jaxllm.spec_decode.draft_model import check_draft, check_draft_parallel
from tests.engine.test_spec_decode import _engine, _run_workload
from tests.engine.test_warmup import MAX_MODEL_LEN
from tests.tiny_models import TOKENIZER_MODEL_CONFIG, _tiny_llama_weights


def _draft(target, directory, **config_overrides):
    """A draft model next to `target`: its tokenizer, a config changed by config_overrides, other weights."""
    shutil.copytree(target, directory)
    config = {**TOKENIZER_MODEL_CONFIG, **config_overrides}
    (directory / "config.json").write_text(json.dumps(config))
    save_file(_tiny_llama_weights(config, seed=1), str(directory / "model.safetensors"))
    return directory


@pytest.fixture(scope="module")
def small_draft(tiny_model_with_tokenizer, tmp_path_factory):
    """One layer instead of two, other random weights, the same vocabulary."""
    return _draft(tiny_model_with_tokenizer, tmp_path_factory.mktemp("draft") / "m", num_hidden_layers=1)


def _spec(draft, k: int = 3) -> dict:
    return {"model": str(draft), "num_speculative_tokens": k}


def _check_draft_released(engine: LLMEngine) -> None:
    """Every request ended: the draft holds no state and its pool has every block back."""
    drafter = engine.drafter
    assert drafter.states == {}
    assert drafter.num_free_blocks == drafter.kv_cache.pool.num_usable_blocks
    assert drafter.runner.inputs.requests == {}


def _greedy_outputs(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 20) -> dict:
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = output.outputs[0].token_ids
    return outputs


def _random_prompts(seed: int, count: int) -> list[list[int]]:
    rng = np.random.RandomState(seed)
    return [rng.randint(3, 49152, size=int(rng.randint(1, 40))).tolist() for _ in range(count)]


# ---------------------------------------------------------------------------------------------- refusals
def test_a_draft_with_another_vocabulary_is_refused_naming_both(tiny_model_with_tokenizer, tmp_path):
    draft = _draft(tiny_model_with_tokenizer, tmp_path / "small-vocab", vocab_size=256)
    with pytest.raises(ValueError, match=rf"draft model '{draft}' has vocab_size 256, the target model "
                                         rf"'{tiny_model_with_tokenizer}' has 49152"):
        _engine(tiny_model_with_tokenizer, _spec(draft))


def test_a_draft_with_a_shorter_context_is_refused(tiny_model_with_tokenizer, tmp_path):
    draft = _draft(tiny_model_with_tokenizer, tmp_path / "short", max_position_embeddings=64)
    with pytest.raises(ValueError, match=rf"draft model '{draft}' has a context of 64 tokens.*target model "
                                         rf"'{tiny_model_with_tokenizer}''s max_model_len {MAX_MODEL_LEN}"):
        _engine(tiny_model_with_tokenizer, _spec(draft))


def test_a_target_run_by_several_processes_with_a_draft_is_refused():
    with pytest.raises(ValueError, match="draft model with a target run by 2 processes is not supported.*'d'"):
        check_draft_parallel("d", 2)
    check_draft_parallel("d", 1)
    config = SimpleNamespace(vocab_size=256, max_position_embeddings=128)
    check_draft("d", config, "t", config, 128)  # the same vocabulary, context enough


# ---------------------------------------------------------------------------------------------- memory budget
BLOCK_SIZE = 8
GPU_LIMIT = 150 << 20  # XLA's allocator limit: 0.75 of a 200 MiB device


@pytest.fixture(scope="module")
def host_models(tiny_model_with_tokenizer, small_draft):
    """(target, draft) on the host: two layers and one, the same vocabulary."""
    return tuple(load_host_model(str(m), dtype="float32") for m in (tiny_model_with_tokenizer, small_draft))


def _num_blocks(target, draft=None, **settings) -> int:
    """The target's block count EngineArgs.resolve gives (the draft's pool gets as many)."""
    args = EngineArgs(max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE, **settings)
    return args.resolve(target, draft=draft)[1].num_blocks


def _block_bytes(model) -> int:
    return kv_block_bytes_per_device(model, BLOCK_SIZE)


def _resident_bytes(model) -> int:
    """Weights and the runner's sampling state (max_num_seqs slots), counted here from the arrays themselves."""
    weights = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(model.params))
    return weights + logit_state_bytes(EngineArgs().max_num_seqs, model.config.vocab_size)


class FakeGpu:
    def memory_stats(self):
        return {"bytes_limit": GPU_LIMIT, "bytes_in_use": 0}


@pytest.fixture
def gpu(monkeypatch):
    """The budget as on a GPU whose allocator may use GPU_LIMIT (XLA's default fraction, 0.75)."""
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kernels, "on_gpu", lambda: True)
    monkeypatch.setattr(jax, "local_devices", lambda *_, **__: [FakeGpu()])


def test_a_kv_budget_is_split_so_both_pools_hold_as_many_blocks(host_models):
    target, draft = host_models
    assert _block_bytes(draft) * 2 == _block_bytes(target)  # one layer of two
    budget = 1 << 20
    alone = _num_blocks(target, kv_cache_memory_bytes=budget)
    shared = _num_blocks(target, draft, kv_cache_memory_bytes=budget)
    assert alone == budget // _block_bytes(target)
    assert shared == budget // (_block_bytes(target) + _block_bytes(draft))
    assert shared < alone


def test_the_cpu_default_cap_covers_both_pools(host_models):
    target, draft = host_models
    per_sequence = MAX_MODEL_LEN // BLOCK_SIZE
    assert _num_blocks(target, draft, max_num_seqs=4) == 1 + 4 * per_sequence  # what they need, for both
    cap = 2 << 30
    assert _num_blocks(target, draft, max_num_seqs=10**6) == cap // (_block_bytes(target) + _block_bytes(draft))


def test_on_a_gpu_the_drafts_weights_and_pool_come_out_of_the_budget(host_models, gpu):
    target, draft = host_models
    usable = min(GPU_LIMIT / 0.75 * 0.5, GPU_LIMIT) * (1 - ACTIVATION_RESERVE_FRACTION)
    alone = _num_blocks(target, gpu_memory_utilization=0.5)
    shared = _num_blocks(target, draft, gpu_memory_utilization=0.5)
    assert alone == int(usable - _resident_bytes(target)) // _block_bytes(target)
    assert shared == (int(usable - _resident_bytes(target) - _resident_bytes(draft))
                      // (_block_bytes(target) + _block_bytes(draft)))
    assert _resident_bytes(draft) > 10 * _block_bytes(target) + 10 * _block_bytes(draft)  # its weights count


def test_a_gpu_budget_too_small_for_both_names_both_models(host_models, gpu):
    target, draft = host_models
    room = _resident_bytes(target) + _resident_bytes(draft) + _block_bytes(target) + _block_bytes(draft)
    utilization = room / (1 - ACTIVATION_RESERVE_FRACTION) / (GPU_LIMIT / 0.75)  # about 1 block of both
    assert _num_blocks(target, gpu_memory_utilization=utilization) >= 2  # enough without the draft
    with pytest.raises(ValueError, match=rf"^gpu_memory_utilization=.* leaves too little for the KV cache: .* "
                                         rf"the target's weights take .* GiB, the draft model's .* GiB .*less than 2 "
                                         rf"blocks of {_block_bytes(target) + _block_bytes(draft)} bytes \(the "
                                         rf"target's {_block_bytes(target)} bytes and the draft model's "
                                         rf"{_block_bytes(draft)} bytes"):
        _num_blocks(target, draft, gpu_memory_utilization=utilization)


def test_a_kv_budget_too_small_for_both_pools_is_refused_naming_both(host_models):
    target, draft = host_models
    budget = 2 * _block_bytes(target) + _block_bytes(draft)  # 2 target blocks, only 1 of both
    assert _num_blocks(target, kv_cache_memory_bytes=budget) == 2
    with pytest.raises(ValueError, match=rf"budget of {budget} bytes \(kv_cache_memory_bytes\) holds 1 blocks of "
                                         rf".*the target's {_block_bytes(target)} bytes and the draft model's "
                                         rf"{_block_bytes(draft)} bytes"):
        _num_blocks(target, draft, kv_cache_memory_bytes=budget)


@pytest.mark.parametrize("settings", [dict(num_gpu_blocks=20), dict(kv_cache_memory_bytes=1 << 18)],
                         ids=["num_gpu_blocks", "kv_cache_memory_bytes"])
def test_the_engines_draft_pool_holds_the_targets_block_count(tiny_model_with_tokenizer, small_draft, host_models,
                                                              settings, caplog):
    target, draft = host_models
    expected = settings.get("num_gpu_blocks") or (1 << 18) // (_block_bytes(target) + _block_bytes(draft))
    with caplog.at_level("INFO", logger="jaxllm.engine.args"):
        engine = _engine(tiny_model_with_tokenizer, _spec(small_draft), **{"num_gpu_blocks": None, **settings})
    assert engine.cache_config.num_blocks == expected
    assert engine.drafter.kv_cache.pool.num_usable_blocks == engine.scheduler.kv_cache.pool.num_usable_blocks
    assert engine.drafter.runner.kv.k.shape[:2] == (1, expected)  # [layers, blocks, ...]: one layer, as many
    assert f"KV cache: {expected} blocks of 8 tokens for the target ({_block_bytes(target)} bytes a block" \
        in caplog.text


# ---------------------------------------------------------------------------------------------- greedy
@pytest.mark.slow
def test_the_target_as_its_own_draft_accepts_every_greedy_proposal(tiny_model_with_tokenizer):
    prompts = _random_prompts(seed=1, count=6)
    plain = _greedy_outputs(_engine(tiny_model_with_tokenizer, None, max_num_seqs=8, num_gpu_blocks=64), prompts)
    engine = _engine(tiny_model_with_tokenizer, _spec(tiny_model_with_tokenizer), max_num_seqs=8,
                     num_gpu_blocks=64)
    assert _greedy_outputs(engine, prompts) == plain
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] > 10, stats
    assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"], stats
    _check_draft_released(engine)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_a_smaller_draft_generates_what_plain_greedy_decoding_does(tiny_model_with_tokenizer, small_draft, batch):
    prompts = _random_prompts(seed=batch, count=batch)
    settings = dict(max_num_seqs=max(batch, 2) * 4, num_gpu_blocks=96)  # rows left for proposals
    plain = _greedy_outputs(_engine(tiny_model_with_tokenizer, None, **settings), prompts)
    engine = _engine(tiny_model_with_tokenizer, _spec(small_draft, k=4), **settings)
    assert _greedy_outputs(engine, prompts) == plain
    assert engine.stats()["spec_decode_num_draft_tokens"] > 0
    _check_draft_released(engine)


@pytest.mark.slow
def test_a_tensor_parallel_target_with_a_draft_on_its_first_device(tiny_model_with_tokenizer, small_draft):
    """Target split over 2 devices, the draft whole on the first: the outputs of plain decoding, either split."""
    prompts = _random_prompts(seed=5, count=4)
    settings = dict(max_num_seqs=16, num_gpu_blocks=96)
    plain = _greedy_outputs(_engine(tiny_model_with_tokenizer, None, **settings), prompts)
    engine = _engine(tiny_model_with_tokenizer, _spec(small_draft, k=3), tensor_parallel_size=2, **settings)
    assert engine.mesh.size == 2 and engine.drafter.runner.mesh.devices.flat[0] == engine.mesh.devices.flat[0]
    assert engine.drafter.runner.mesh.size == 1
    assert _greedy_outputs(engine, prompts) == plain
    assert engine.stats()["spec_decode_num_draft_tokens"] > 0
    _check_draft_released(engine)


# ---------------------------------------------------------------------------------------------- random workloads
@pytest.mark.slow
@pytest.mark.parametrize("draft_is_target", [True, False], ids=["self-draft", "small-draft"])
@pytest.mark.parametrize("settings", [
    dict(max_num_seqs=4, max_num_batched_tokens=32, num_gpu_blocks=32),  # small pool: preemption
    dict(max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=96),
    dict(max_num_seqs=6, max_num_batched_tokens=16, num_gpu_blocks=48, async_scheduling=False),  # chunked
], ids=["preemption", "batch-8", "batch-6-chunked-sync"])
def test_random_workload_generates_the_same_with_a_draft_model(tiny_model_with_tokenizer, small_draft, settings,
                                                               draft_is_target):
    """Greedy and seeded random sampling, n > 1, prefix hits, aborts, preemption: the same outputs."""
    plain = _run_workload(_engine(tiny_model_with_tokenizer, None, **settings), seed=3)
    draft = tiny_model_with_tokenizer if draft_is_target else small_draft
    engine = _engine(tiny_model_with_tokenizer, _spec(draft), **settings)
    assert _run_workload(engine, seed=3) == plain
    stats = engine.stats()
    assert stats["spec_decode_num_drafts"] > 10, stats
    assert sum(stats["spec_decode_num_accepted_tokens_per_pos"]) == stats["spec_decode_num_accepted_tokens"]
    _check_draft_released(engine)


@pytest.mark.slow
def test_preempted_requests_drop_their_draft_state(tiny_model_with_tokenizer, small_draft):
    engine = _engine(tiny_model_with_tokenizer, _spec(small_draft), max_num_seqs=4, num_gpu_blocks=12)
    prompts = _random_prompts(seed=7, count=4)
    plain = _greedy_outputs(_engine(tiny_model_with_tokenizer, None, max_num_seqs=4, num_gpu_blocks=12), prompts, 30)
    assert _greedy_outputs(engine, prompts, 30) == plain
    assert engine.scheduler.num_preemptions > 0
    _check_draft_released(engine)


@pytest.mark.slow
def test_after_warmup_a_draft_model_compiles_nothing(tiny_model_with_tokenizer, small_draft):
    engine = _engine(tiny_model_with_tokenizer, _spec(small_draft), warmup=True)
    with CompileCounter() as compiles:
        _run_workload(engine, seed=5, num_requests=20)
    assert compiles.count == 0, compiles.events
    assert engine.stats()["spec_decode_num_drafts"] > 0
    _check_draft_released(engine)


@pytest.mark.slow
def test_llm_takes_a_draft_model(tiny_model_with_tokenizer, small_draft):
    from jaxllm.llm import LLM
    settings = dict(max_model_len=MAX_MODEL_LEN, block_size=8, max_num_seqs=4, num_gpu_blocks=32)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in _random_prompts(seed=11, count=1)]
    plain = LLM(str(tiny_model_with_tokenizer), **settings).generate(prompts, params, use_tqdm=False)
    llm = LLM(str(tiny_model_with_tokenizer), speculative_config={"method": "draft_model", "model": str(small_draft),
                                                                   "num_speculative_tokens": 2}, **settings)
    drafted = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in drafted] == [o.outputs[0].token_ids for o in plain]
    assert llm.engine.stats()["spec_decode_num_draft_tokens"] > 0


def test_the_server_flag_takes_a_draft_model(tiny_model_with_tokenizer):
    from jaxllm.entrypoints.cli import build_parser
    spec = json.dumps({"method": "draft_model", "model": "d", "num_speculative_tokens": 2})
    args = build_parser("serve").parse_args(["serve", "--speculative-config", spec])
    assert EngineArgs.from_cli_args(args).speculative_config["model"] == "d"
