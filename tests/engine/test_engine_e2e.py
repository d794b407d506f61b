"""The engine end to end on a tiny random model: continuous batching must not change what a request generates."""

from __future__ import annotations

import numpy as np
import pytest

from jaxllm import load_model
from jaxllm.compile_counter import CompileCounter
from tests.greedy_reference import greedy_generate
from jaxllm.llm import LLM
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward
from jaxllm.sampling_params import SamplingParams
from tests.unit.test_sampler import reference_adjust

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, detokenize=False)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama3")[0]


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.RandomState(0)
    shared = rng.randint(3, 256, size=20).tolist()  # a common prefix: prefix-cache hits
    return [rng.randint(3, 256, size=n).tolist() for n in (3, 9, 17, 30, 5, 41, 12, 7)] + \
           [shared + [7, 8], shared + [9], shared + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


@pytest.fixture(scope="module")
def expected(model_dir, prompts):
    """One request at a time through the simple greedy loop (itself checked against HF generate)."""
    loaded = load_model(model_dir)
    return [greedy_generate(loaded, [p], max_tokens=GREEDY.max_tokens)[0] for p in prompts]


def make_llm(model_dir, **kwargs):
    defaults = dict(skip_tokenizer=True, max_model_len=128, block_size=4)
    return LLM(str(model_dir), **{**defaults, **kwargs})


def token_lists(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    dict(max_num_seqs=16, max_num_batched_tokens=256),  # everything in one batch
    dict(max_num_seqs=4, max_num_batched_tokens=16),  # chunked prefill, mixed steps, queueing
    dict(max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=24),  # a tiny pool: preemption
    dict(max_num_seqs=8, max_num_batched_tokens=64, enable_prefix_caching=False),
], ids=["large-batch", "chunked", "preemption", "no-prefix-cache"])
def test_batched_greedy_equals_one_at_a_time(settings, model_dir, prompts, expected):
    llm = make_llm(model_dir, **settings)
    for _ in range(2):  # the second round finds the first round's blocks in the prefix cache
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        assert token_lists(outputs) == expected
    stats = llm.engine.stats()
    assert stats["kv_cache_usage"] == 0.0
    if settings.get("enable_prefix_caching", True):
        assert stats["prefix_cache_hits"] > 0


@pytest.mark.slow
def test_preemption_happens_and_output_is_unchanged(model_dir, prompts, expected):
    llm = make_llm(model_dir, max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=24)
    preempted = []
    original = llm.engine.scheduler._preempt

    def spy(victim, chunks):
        preempted.append(victim.request_id)
        original(victim, chunks)

    llm.engine.scheduler._preempt = spy
    assert token_lists(llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)) == expected
    assert preempted, "the tiny pool was meant to force preemption"


@pytest.mark.slow
def test_seeded_sampling_is_independent_of_batch_and_n_shares_it(model_dir, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=7, ignore_eos=True, detokenize=False)
    alone = make_llm(model_dir, max_num_seqs=1).generate({"prompt_token_ids": prompts[2]}, params, use_tqdm=False)
    crowd = make_llm(model_dir, max_num_seqs=8, max_num_batched_tokens=32)
    batch = [{"prompt_token_ids": p} for p in prompts]
    unseeded = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, detokenize=False)
    outputs = crowd.generate(batch, [params if i == 2 else unseeded for i in range(len(batch))], use_tqdm=False)
    assert outputs[2].outputs[0].token_ids == alone[0].outputs[0].token_ids
    # n = 3: sample i equals a single request seeded with seed + i
    fan = crowd.generate({"prompt_token_ids": prompts[2]}, SamplingParams(
        n=3, temperature=1.0, top_p=0.9, max_tokens=10, seed=7, ignore_eos=True, detokenize=False), use_tqdm=False)
    assert [c.index for c in fan[0].outputs] == [0, 1, 2]
    assert fan[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    for i in (1, 2):
        single = crowd.generate({"prompt_token_ids": prompts[2]}, SamplingParams(
            temperature=1.0, top_p=0.9, max_tokens=10, seed=7 + i, ignore_eos=True, detokenize=False),
            use_tqdm=False)
        assert fan[0].outputs[i].token_ids == single[0].outputs[0].token_ids
    assert len({tuple(c.token_ids) for c in fan[0].outputs}) > 1


def test_logprobs_are_log_softmax_of_model_logits(model_dir):
    llm = make_llm(model_dir)
    prompt = [5, 17, 99, 3, 42, 8]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(
        temperature=0.0, max_tokens=3, logprobs=5, prompt_logprobs=2, ignore_eos=True, detokenize=False),
        use_tqdm=False)[0]
    loaded = load_model(model_dir)
    tokens = prompt + out.outputs[0].token_ids
    kv = init_kv_cache(loaded.config, 8, 16)
    batch = build_step_batch([SequenceChunk(tokens, 0, [1, 2], want_logits="all")], 16)
    logits, _ = jit_forward(loaded.config)(loaded.params, kv, batch)
    logits = np.asarray(logits, np.float64)
    logprobs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    for step, entry in enumerate(out.outputs[0].logprobs):
        row = logprobs[len(prompt) - 1 + step]
        top5 = np.argsort(-row)[:5]
        assert list(entry)[:5] == top5.tolist()
        for token, lp in entry.items():
            assert lp.logprob == pytest.approx(row[token], abs=1e-4)
            assert lp.rank == 1 + int((row > row[token]).sum())
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos, entry in enumerate(out.prompt_logprobs[1:], start=1):
        assert entry[prompt[pos]].logprob == pytest.approx(logprobs[pos - 1][prompt[pos]], abs=1e-4)
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(logprobs[len(prompt) - 1 + i][t] for i, t in enumerate(out.outputs[0].token_ids)), abs=1e-3)


@pytest.mark.slow
def test_long_mixed_workload_uses_only_bucket_programs(model_dir):
    llm = make_llm(model_dir, max_num_seqs=8, max_num_batched_tokens=32)
    rng = np.random.RandomState(1)
    prompts = [{"prompt_token_ids": rng.randint(3, 256, size=rng.randint(1, 60)).tolist()} for _ in range(40)]
    params = [SamplingParams(temperature=float(rng.rand() > 0.5), max_tokens=int(rng.randint(1, 30)),
                             ignore_eos=True, detokenize=False) for _ in prompts]
    llm.generate(prompts, params, use_tqdm=False)
    runner = llm.engine.runner
    assert runner.programs_used <= set(runner.buckets.all_programs())
    assert set(runner.programs.compiled) == runner.programs_used  # built on first use, one per key
    with CompileCounter() as compiles:
        llm.generate(prompts, params, use_tqdm=False)  # the same workload again compiles nothing new
    assert compiles.count == 0


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    dict(max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=24),  # preemption with tokens in flight
    dict(max_num_seqs=3, max_num_batched_tokens=16),  # chunked prefill, queueing
], ids=["preemption", "chunked"])
def test_async_scheduling_changes_no_output(settings, model_dir, prompts):
    """Steps dispatched ahead of their predecessor's results give the same outputs, token for token."""
    rng = np.random.RandomState(3)
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, detokenize=False),
              SamplingParams(temperature=0.0, max_tokens=9, stop_token_ids=[17, 33, 40], detokenize=False),
              SamplingParams(temperature=0.9, top_p=0.8, seed=5, max_tokens=15, detokenize=False, logprobs=2),
              SamplingParams(n=2, temperature=1.0, max_tokens=7, min_tokens=3, stop_token_ids=[9],
                             detokenize=False),
              SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=1, detokenize=False),
              SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.4, frequency_penalty=0.6,
                             presence_penalty=0.3, detokenize=False),  # penalties: counted on the device
              SamplingParams(temperature=0.8, seed=9, max_tokens=10, logit_bias={5: 2.0}, frequency_penalty=1.2,
                             logprobs=1, detokenize=False)]
    batch_params = [params[int(i)] for i in rng.randint(0, len(params), len(prompts))]
    runs = []
    for async_scheduling in (False, True):
        llm = make_llm(model_dir, async_scheduling=async_scheduling, **settings)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], batch_params, use_tqdm=False)
        runs.append(outputs)
    for sync, ahead in zip(*runs):
        assert [(c.token_ids, c.finish_reason) for c in sync.outputs] == \
            [(c.token_ids, c.finish_reason) for c in ahead.outputs]
        assert _logprob_values(sync) == pytest.approx(_logprob_values(ahead), abs=1e-5)


PENALIZED = [
    SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.8, ignore_eos=True, detokenize=False),
    SamplingParams(temperature=0.0, max_tokens=10, frequency_penalty=1.5, presence_penalty=0.5, ignore_eos=True,
                   detokenize=False),
    SamplingParams(temperature=0.0, max_tokens=10, logit_bias={7: 3.0, 11: 2.5}, frequency_penalty=2.0,
                   min_tokens=4, stop_token_ids=[7], ignore_eos=True, detokenize=False),
]


def penalized_greedy_reference(loaded, prompt, params: SamplingParams, eos_token_ids) -> list[int]:
    """Greedy decoding with the numpy reference adjustments on the whole sequence's logits, recomputed each step
    (before min_tokens, EOS and the stop ids are masked)."""
    block_size, num_tokens = 16, 64
    table = list(range(1, 1 + num_tokens // block_size))
    kv = init_kv_cache(loaded.config, 1 + len(table), block_size, np.float32)
    forward = jit_forward(loaded.config)
    output = []
    while len(output) < params.max_tokens:
        batch = build_step_batch([SequenceChunk(prompt + output, 0, table)], block_size, num_tokens=num_tokens)
        logits, kv = forward(loaded.params, kv, batch)
        masked = [*params.stop_token_ids, *eos_token_ids] if len(output) < params.min_tokens else []
        output.append(int(reference_adjust(np.asarray(logits[0]), prompt, output, params, masked).argmax()))
        if output[-1] in params.stop_token_ids and len(output) >= params.min_tokens:
            break
    return output


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    dict(max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=24),  # preemption: the slot rows rewritten
    dict(max_num_seqs=3, max_num_batched_tokens=16, async_scheduling=False),
], ids=["preemption-async", "chunked-sync"])
def test_penalties_counted_on_the_device_match_a_host_reference(settings, model_dir, prompts):
    loaded = load_model(model_dir)
    params = [PENALIZED[i % len(PENALIZED)] for i in range(len(prompts))]
    llm = make_llm(model_dir, **settings)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    eos = llm.engine.runner.inputs.eos_token_ids
    for prompt, p, out in zip(prompts, params, outputs):
        assert out.outputs[0].token_ids == penalized_greedy_reference(loaded, prompt, p, eos)


def _logprob_values(output) -> list[float]:
    entries = [e for c in output.outputs for e in c.logprobs or []] + [e for e in output.prompt_logprobs or [] if e]
    return [lp.logprob for entry in entries for lp in entry.values()]


def test_requests_that_cannot_fit_are_rejected_and_nothing_is_left_behind(model_dir):
    llm = make_llm(model_dir)
    with pytest.raises(ValueError, match=r"prompt \(100 tokens\) \+ max_tokens \(100\) = 200 exceeds max_model_len"):
        llm.generate([{"prompt_token_ids": [1] * 5}, {"prompt_token_ids": [1] * 100}],
                     SamplingParams(max_tokens=100, detokenize=False), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] = 999 is not a token id in \[0, 256\)"):
        llm.generate({"prompt_token_ids": [1, 999]}, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate({"prompt_token_ids": []}, use_tqdm=False)
