"""LLM.beam_search on a tiny random Llama against Hugging Face's generate(num_beams=W) on the same weights, and the
KV blocks the beams hold.

The model's EOS id is set to a token the random model often ranks high, so that beams finish at different
lengths and the EOS rules (which candidates finish, length normalization, early stopping) are exercised.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from jaxllm.beam_search import BeamSearchParams
from jaxllm.llm import LLM
from tests.hf_beams import hf_beams

PROMPTS = [[5, 6, 7, 8], [100, 3, 17], [42] * 9, [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12]]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model(tiny_model_dir, tmp_path_factory):
    """(model directory with a frequent EOS id, the torch model with the same config)."""
    source, hf = tiny_model_dir("llama2")
    eos = _frequent_token(hf)
    directory = tmp_path_factory.mktemp("beam-llama2")
    for path in source.iterdir():
        shutil.copy(path, directory / path.name)
    config = json.loads((directory / "config.json").read_text())
    config["eos_token_id"] = eos
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").unlink(missing_ok=True)
    return directory, hf, eos


def _frequent_token(hf) -> int:
    """A token among the 2 most likely at many positions of the prompts' greedy continuations."""
    counts = torch.zeros(hf.config.vocab_size)
    for prompt in PROMPTS:
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, output_scores=True,
                          return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
        for scores in out.scores:
            counts[scores[0].topk(2).indices] += 1
    return int(counts.argmax())


@pytest.fixture(scope="module")
def llm(model):
    return LLM(str(model[0]), skip_tokenizer=True, max_model_len=64, block_size=4)


@pytest.mark.parametrize("width,length_penalty,early_stopping", [
    (2, 1.0, False), (4, 1.0, False), (4, 1.0, True), (4, 0.0, "never"), (2, 2.0, "never"), (4, -0.5, False)])
def test_beams_equal_hugging_face(llm, model, width, length_penalty, early_stopping):
    _, hf, eos = model
    params = BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS, length_penalty=length_penalty,
                              early_stopping=early_stopping)
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params)
    ended_on_eos = 0
    for prompt, output in zip(PROMPTS, outputs):
        expected = hf_beams(hf, prompt, eos, width, MAX_TOKENS, length_penalty, early_stopping)
        got = [(s.output_token_ids, s.score) for s in output.sequences]
        assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected], prompt
        assert [score for _, score in got] == pytest.approx([score for _, score in expected], abs=1e-4)
        for sequence in output.sequences:
            assert sequence.tokens[:len(prompt)] == prompt
            assert len(sequence.logprobs) == len(sequence.output_token_ids)
            stopped = sequence.output_token_ids[-1] == eos
            ended_on_eos += stopped
            assert (sequence.finish_reason, sequence.stop_reason) == (("stop", eos) if stopped else ("length", None))
            cum = sum(step[t].logprob for step, t in zip(sequence.logprobs, sequence.output_token_ids))
            assert sequence.cum_logprob == pytest.approx(cum, abs=1e-5)
    if length_penalty <= 1.0:  # (2.0 favours long hypotheses: none ends on EOS there)
        assert ended_on_eos > 0  # the EOS rules were exercised


def test_ignore_eos_runs_every_beam_to_max_tokens(llm, model):
    _, hf, eos = model
    params = BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS, ignore_eos=True)
    (output,) = llm.beam_search({"prompt_token_ids": PROMPTS[0]}, params)
    expected = hf_beams(hf, PROMPTS[0], None, 3, MAX_TOKENS, 1.0, False)
    assert [s.output_token_ids for s in output.sequences] == [tokens for tokens, _ in expected]
    assert all(s.finish_reason == "length" and len(s.output_token_ids) == MAX_TOKENS for s in output.sequences)


def test_beams_share_their_prefix_blocks(llm, model):
    """Held blocks (ref count > 0) never exceed the prompt's blocks + W x (a beam's own tokens' blocks + 1) while
    the beams run, far less than W whole sequences (what the same search holds without the prefix cache); and
    every block is free again afterwards."""
    block_size, width, new_tokens, prompt = 4, 4, 8, list(range(10, 50))  # a 40-token prompt: 10 blocks
    params = BeamSearchParams(width, max_tokens=new_tokens, ignore_eos=True)
    run = lambda engine: engine.beam_search({"prompt_token_ids": prompt}, params)  # noqa: E731
    peak = _peak_held_blocks(llm, run)
    own = -(-new_tokens // block_size) + 1  # a beam's own tokens, and the partial block it recomputes
    assert len(prompt) // block_size + width <= peak <= len(prompt) // block_size + width * own
    unshared = LLM(str(model[0]), skip_tokenizer=True, max_model_len=64, block_size=4, enable_prefix_caching=False)
    assert _peak_held_blocks(unshared, run) >= width * (len(prompt) + new_tokens - 1) // block_size > 2 * peak
    pool = llm.engine.scheduler.kv_cache.pool
    assert pool.num_free_blocks == pool.num_usable_blocks


def _peak_held_blocks(llm, run) -> int:
    """The most blocks held right after any schedule() (when a step's requests hold their blocks)."""
    scheduler = llm.engine.scheduler
    pool, schedule = scheduler.kv_cache.pool, scheduler.schedule
    peak = 0

    def counted_schedule():
        nonlocal peak
        out = schedule()
        peak = max(peak, pool.num_usable_blocks - pool.num_free_blocks)
        return out

    scheduler.schedule = counted_schedule
    try:
        run(llm)
    finally:
        scheduler.schedule = schedule
    return peak


def test_all_prompts_beams_run_in_the_same_engine_steps(llm):
    steps_before = llm.engine.num_steps
    llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], BeamSearchParams(4, max_tokens=3, ignore_eos=True))
    assert llm.engine.num_steps - steps_before == 3  # each beam step is one engine step for all 16 beams


@pytest.mark.parametrize("field,kwargs,message", [
    ("beam_width", dict(beam_width=0), "beam_width must be an int >= 1"),
    ("max_tokens", dict(max_tokens=1.5), "max_tokens must be an int >= 1"),
    ("length_penalty", dict(length_penalty=float("nan")), "length_penalty must be a finite number"),
    ("temperature", dict(temperature=-1.0), "temperature must be >= 0"),
    ("early_stopping", dict(early_stopping="sometimes"), "early_stopping must be True, False or 'never'"),
    ("ignore_eos", dict(ignore_eos=1), "ignore_eos must be a bool"),
])
def test_bad_params_are_refused_by_name(field, kwargs, message):
    with pytest.raises(ValueError, match=message):
        BeamSearchParams(**{**dict(beam_width=2, max_tokens=4), **kwargs})


def test_refusals_that_need_the_engine(llm):
    with pytest.raises(ValueError, match="beam_width must be <= 10"):
        llm.beam_search({"prompt_token_ids": [1, 2]}, BeamSearchParams(11, max_tokens=2))
    with pytest.raises(ValueError, match="max_tokens 60 with a prompt of 5 tokens .* exceeds max_model_len 64"):
        llm.beam_search({"prompt_token_ids": [1] * 5}, BeamSearchParams(2, max_tokens=60))
    with pytest.raises(ValueError, match="params must be a BeamSearchParams"):
        llm.beam_search({"prompt_token_ids": [1, 2]}, dict(beam_width=2, max_tokens=2))
