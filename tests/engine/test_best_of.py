"""best_of > n: best_of sequences are sampled and the n with the highest cumulative logprob are returned."""

from __future__ import annotations

import pytest

from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.llm import LLM
from jaxllm.sampling_params import SamplingParams

pytestmark = pytest.mark.slow  # each test runs an engine over many samples (~5-10 s)

PROMPT = [5, 6, 7, 8]


def sampled(**params) -> SamplingParams:
    return SamplingParams(**{**dict(temperature=1.0, seed=11, max_tokens=6, ignore_eos=True, detokenize=False),
                             **params})


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama2")[0]


def test_the_n_best_of_the_samples_are_returned_best_first(model_dir):
    llm = LLM(str(model_dir), skip_tokenizer=True, max_model_len=64, block_size=4)
    generate = lambda params: llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0]  # noqa: E731
    everyone = generate(sampled(n=4, logprobs=0)).outputs  # the same four samples (child i is seeded seed + i)
    scores = sorted(((c.cumulative_logprob, c.token_ids) for c in everyone), key=lambda s: s[0], reverse=True)
    assert len({round(score, 4) for score, _ in scores}) == 4

    best = generate(sampled(n=2, best_of=4))  # asks for no logprobs: ranked all the same
    assert [c.index for c in best.outputs] == [0, 1]
    assert [c.token_ids for c in best.outputs] == [tokens for _, tokens in scores[:2]]
    for completion, (score, _) in zip(best.outputs, scores):
        assert completion.cumulative_logprob == pytest.approx(score, abs=1e-4)
        assert completion.logprobs is None and completion.finish_reason == "length"

    with_logprobs = generate(sampled(n=2, best_of=4, logprobs=1)).outputs
    assert [c.token_ids for c in with_logprobs] == [c.token_ids for c in best.outputs]
    assert all(len(c.logprobs) == len(c.token_ids) for c in with_logprobs)


def make_engine(model_dir, **args) -> LLMEngine:
    return LLMEngine(EngineArgs(model=str(model_dir), skip_tokenizer=True, max_model_len=64, block_size=4,
                                max_num_seqs=8, **args))


@pytest.mark.parametrize("output_kind", ["final", "cumulative", "delta"])
def test_one_output_with_the_whole_chosen_completions_for_every_kind(model_dir, output_kind):
    engine = make_engine(model_dir)
    engine.add_request("ranked", PROMPT, sampled(n=2, best_of=3), output_kind=output_kind)
    engine.add_request("reference", PROMPT, sampled(n=3, logprobs=0), output_kind="final")
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    assert len(outputs["ranked"]) == 1 and outputs["ranked"][0].finished
    reference = sorted(outputs["reference"][0].outputs, key=lambda c: c.cumulative_logprob, reverse=True)
    assert [c.token_ids for c in outputs["ranked"][0].outputs] == [c.token_ids for c in reference[:2]]
    assert all(len(c.token_ids) == 6 for c in outputs["ranked"][0].outputs)


def test_abort_ends_every_sample_and_frees_their_blocks(model_dir):
    engine = make_engine(model_dir, async_scheduling=False)  # then all three samples run after the first step
    engine.add_request("ranked", PROMPT, sampled(n=1, best_of=3, max_tokens=40))
    for _ in range(3):
        assert engine.step() == []  # nothing is reported before all samples finished
    pool = engine.scheduler.kv_cache.pool
    assert len(engine.scheduler.running) == 3 and pool.num_free_blocks < pool.num_usable_blocks
    engine.abort_request("ranked")
    assert not engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 0
    assert pool.num_free_blocks == pool.num_usable_blocks
