"""SamplingParams: vLLM's defaults, normalisation, and a ValueError naming the field for every bad value."""

from __future__ import annotations

import dataclasses

import pytest

from jaxllm.sampling_params import MAX_LOGPROBS, SamplingParams, SamplingType

VLLM_DEFAULTS = dict(
    n=1, best_of=None, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=1.0, top_p=1.0,
    top_k=0, min_p=0.0, seed=None, stop=[], stop_token_ids=[], ignore_eos=False, max_tokens=16, min_tokens=0,
    logprobs=None, prompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True,
    include_stop_str_in_output=False, logit_bias=None, allowed_token_ids=None, bad_words=None, logprob_token_ids=None, detokenize=True,
    structured_outputs=None)


def test_defaults_equal_vllm():
    assert dataclasses.asdict(SamplingParams()) == VLLM_DEFAULTS


@pytest.mark.parametrize("field, value, message", [
    ("n", 0, "n must be an int >= 1, got 0"),
    ("n", 1.5, "n must be an int >= 1, got 1.5"),
    ("best_of", 0, "best_of must be an int >= 1, got 0"),
    ("best_of", 2.5, "best_of must be an int >= 1, got 2.5"),
    ("best_of", "3", "best_of must be an int >= 1, got '3'"),
    ("presence_penalty", 2.5, r"presence_penalty must be in \[-2, 2\], got 2.5"),
    ("frequency_penalty", -2.1, r"frequency_penalty must be in \[-2, 2\], got -2.1"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0, got 0.0"),
    ("repetition_penalty", float("inf"), "repetition_penalty must be > 0, got inf"),
    ("temperature", -1.0, "temperature must be >= 0, got -1.0"),
    ("temperature", float("nan"), "temperature must be >= 0, got nan"),
    ("top_p", 1.5, r"top_p must be in \(0, 1\], got 1.5"),
    ("top_p", 0.0, r"top_p must be in \(0, 1\], got 0.0"),
    ("top_k", -2, r"top_k must be 0 or -1 \(disabled\), or >= 1, got -2"),
    ("top_k", 2.0, "top_k must be .*, got 2.0"),
    ("min_p", 1.1, r"min_p must be in \[0, 1\], got 1.1"),
    ("seed", "7", "seed must be an int, got '7'"),
    ("max_tokens", 0, "max_tokens must be an int >= 1, got 0"),
    ("min_tokens", -1, "min_tokens must be an int >= 0, got -1"),
    ("min_tokens", 17, r"min_tokens must be <= max_tokens \(16\), got 17"),
    ("logprobs", -1, rf"logprobs must be an int in \[0, {MAX_LOGPROBS}\], got -1"),
    ("logprobs", MAX_LOGPROBS + 1, rf"logprobs must be an int in \[0, {MAX_LOGPROBS}\], got {MAX_LOGPROBS + 1}"),
    ("prompt_logprobs", 21, r"prompt_logprobs must be an int in \[0, 20\], got 21"),
    ("stop", ["ok", ""], "stop must be non-empty strings"),
    ("stop", 5, "stop must be a string or a list of strings, got 5"),
    ("stop_token_ids", 5, "stop_token_ids must be a list of token ids, got 5"),
    ("stop_token_ids", [3, -1], "stop_token_ids must be an int >= 0, got -1"),
    ("stop_token_ids", [3, "4"], "stop_token_ids must be an int >= 0, got '4'"),
    ("logit_bias", {"5": 1.0}, "logit_bias must be keyed by token ids >= 0, got '5'"),
    ("logit_bias", {5: float("inf")}, "logit_bias must be finite values, got inf"),
    ("logit_bias", [(5, 1.0)], "logit_bias must be a dict"),
])
def test_invalid_value_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_cross_field_checks():
    with pytest.raises(ValueError, match="stop strings need detokenize=True"):
        SamplingParams(stop="x", detokenize=False)
    with pytest.raises(ValueError, match=r"n must be 1 when sampling greedily \(temperature 0\), got 2"):
        SamplingParams(n=2, temperature=0.0)
    assert SamplingParams(max_tokens=None, min_tokens=1000).max_tokens is None


def test_best_of_must_cover_n_and_sample_randomly():
    with pytest.raises(ValueError, match=r"best_of must be >= n \(3\), got 2"):
        SamplingParams(n=3, best_of=2)
    with pytest.raises(ValueError, match=r"best_of must be 1 when sampling greedily \(temperature 0\), got 3"):
        SamplingParams(best_of=3, temperature=0.0)
    assert SamplingParams(best_of=1, temperature=0.0).num_sequences == 1
    ranked = SamplingParams(n=3, best_of=5)
    assert (ranked.num_sequences, ranked.ranks_sequences) == (5, True)
    assert (SamplingParams(n=3).num_sequences, SamplingParams(n=3, best_of=3).ranks_sequences) == (3, False)


def test_normalisation():
    p = SamplingParams(top_k=-1, stop="###", stop_token_ids=[5, 3, 5])
    assert (p.top_k, p.stop, p.stop_token_ids) == (0, ["###"], [5, 3])
    greedy = SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2)
    assert (greedy.top_k, greedy.top_p, greedy.min_p) == (0, 1.0, 0.0)
    assert SamplingParams(temperature=1e-3).temperature == 1e-2  # tiny temperatures overflow; raised as in vLLM


def test_sampling_type():
    assert SamplingParams(temperature=0.0).sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=9e-6).sampling_type == SamplingType.GREEDY
    assert SamplingParams().sampling_type == SamplingType.RANDOM
    assert SamplingParams(seed=0).sampling_type == SamplingType.RANDOM_SEED


def test_validate_for_vocab():
    SamplingParams(logit_bias={0: 1.0, 99: -1.0}, stop_token_ids=[99]).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"logit_bias must hold token ids in \[0, 100\), got \[100\]"):
        SamplingParams(logit_bias={100: 1.0}).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"stop_token_ids must hold token ids in \[0, 100\), got \[120\]"):
        SamplingParams(stop_token_ids=[1, 120]).validate_for_vocab(100)
