"""LLMEngine's streaming interface: add_request / step / abort_request, delta outputs, compilation cache."""

from __future__ import annotations

import pytest

from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, detokenize=False)


def make_engine(model_dir, **kwargs):
    return LLMEngine(EngineArgs(model=str(model_dir), skip_tokenizer=True, max_model_len=128, block_size=4,
                                max_num_seqs=4, **kwargs))


def test_delta_stream_adds_up_to_the_cumulative_output(tiny_model_dir):
    engine = make_engine(tiny_model_dir("llama2")[0])
    engine.add_request("delta", [5, 6, 7, 8], PARAMS, output_kind="delta")
    engine.add_request("whole", [5, 6, 7, 8], PARAMS, output_kind="cumulative")
    streamed, last_whole, steps_with_both = [], None, 0
    while engine.has_unfinished_requests():
        outputs = {o.request_id: o for o in engine.step()}
        steps_with_both += len(outputs) == 2
        if "delta" in outputs:
            streamed += outputs["delta"].outputs[0].token_ids
        last_whole = outputs.get("whole", last_whole)
    assert last_whole.finished and last_whole.outputs[0].finish_reason == "length"
    assert streamed == last_whole.outputs[0].token_ids and len(streamed) == 10
    assert steps_with_both == 10  # both requests ran in every step: continuous batching


def test_delta_stream_reports_each_sample_once_and_its_finish_once(tiny_model_dir):
    """n = 3 samples that stop at different steps: a finished sample is not reported again while the others run."""
    engine = make_engine(tiny_model_dir("llama2")[0])
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, stop_token_ids=list(range(0, 256, 3)),
                            detokenize=False)
    engine.add_request("fan", [5, 6, 7, 8], params, output_kind="delta")
    tokens, finishes, finished_at, step = {}, {}, {}, 0
    while engine.has_unfinished_requests():
        step += 1
        for output in engine.step():
            for completion in output.outputs:
                assert completion.index not in finishes, f"sample {completion.index} reported after its finish"
                tokens.setdefault(completion.index, []).extend(completion.token_ids)
                if completion.finish_reason is not None:
                    finishes[completion.index], finished_at[completion.index] = completion.finish_reason, step
    assert sorted(finishes) == [0, 1, 2]
    assert len(set(finished_at.values())) > 1, finished_at  # the samples did stop at different steps
    assert all(1 <= len(t) <= 12 for t in tokens.values())


@pytest.mark.slow
def test_abort_mid_generation_frees_blocks_and_others_finish(tiny_model_dir):
    engine = make_engine(tiny_model_dir("llama2")[0])
    engine.add_request("keep", [1, 2, 3], PARAMS)
    engine.add_request("drop", list(range(10, 30)), PARAMS)
    engine.step()
    engine.step()
    pool = engine.scheduler.kv_cache.pool
    held = pool.num_usable_blocks - pool.num_free_blocks
    engine.abort_request("drop")
    assert pool.num_usable_blocks - pool.num_free_blocks < held
    assert engine.get_num_unfinished_requests() == 1
    finals = []
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finals] == ["keep"] and len(finals[0].outputs[0].token_ids) == 10
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_duplicate_request_id_is_refused(tiny_model_dir):
    engine = make_engine(tiny_model_dir("llama2")[0])
    engine.add_request("a", [1, 2], PARAMS)
    with pytest.raises(ValueError, match="request_id 'a' is already in use"):
        engine.add_request("a", [1, 2], PARAMS)


def test_lone_surrogate_in_a_text_prompt_is_a_value_error(tiny_model_with_tokenizer):
    engine = LLMEngine(EngineArgs(model=str(tiny_model_with_tokenizer), max_model_len=128, max_num_seqs=4))
    with pytest.raises(ValueError, match="surrogate"):
        engine.add_request("bad", "a \ud800 b", PARAMS)
    assert not engine.has_unfinished_requests()


def test_a_failure_while_adding_leaves_nothing_behind(tiny_model_dir, monkeypatch):
    engine = make_engine(tiny_model_dir("llama2")[0])

    def broken_add(*args, **kwargs):
        raise RuntimeError("a bug while registering the request")

    with monkeypatch.context() as patch:
        patch.setattr(engine.processor, "add", broken_add)
        with pytest.raises(RuntimeError, match="a bug"):
            engine.add_request("half-added", [1, 2, 3], SamplingParams(n=2, max_tokens=4))
    assert not engine.has_unfinished_requests()  # no child left in the scheduler
    engine.add_request("half-added", [1, 2, 3], PARAMS)  # the id is free again
    while engine.has_unfinished_requests():
        engine.step()


@pytest.mark.slow
def test_samples_of_one_prompt_run_together_with_async_scheduling(tiny_model_dir):
    """The siblings of an n > 1 request wait only for the first sample's prompt blocks, not for it to finish."""
    engine = make_engine(tiny_model_dir("llama2")[0], async_scheduling=True)
    engine.add_request("n3", [1, 2, 3, 4, 5], SamplingParams(n=3, temperature=1.0, max_tokens=20, ignore_eos=True,
                                                             detokenize=False))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert steps <= 20 + 3, steps  # 20 tokens each; the siblings start once the first one's prefill is back


@pytest.mark.parametrize("extra", [{}, {"logit_bias": {9: 5.0}, "repetition_penalty": 1.3}], ids=["alone", "mixed"])
def test_allowed_token_ids_are_the_only_tokens_sampled(tiny_model_dir, extra):
    engine = make_engine(tiny_model_dir("llama2")[0])
    allowed = [5, 9, 200]
    engine.add_request("only", [5, 6, 7, 8], SamplingParams(n=2, temperature=1.5, seed=3, max_tokens=24,
                                                            ignore_eos=True, detokenize=False,
                                                            allowed_token_ids=allowed, **extra))
    engine.add_request("free", [5, 6, 7, 8], SamplingParams(temperature=1.5, seed=3, max_tokens=24, ignore_eos=True,
                                                            detokenize=False))
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    sampled = {t for c in finals["only"].outputs for t in c.token_ids}
    assert sampled <= set(allowed) and len(sampled) > 1
    assert set(finals["free"].outputs[0].token_ids) - set(allowed)  # the row beside it is not restricted
    with pytest.raises(ValueError, match=r"allowed_token_ids must hold token ids in \[0, 256\)"):
        engine.add_request("bad", [5], SamplingParams(allowed_token_ids=[256]))
    with pytest.raises(ValueError, match="allowed_token_ids must be a non-empty list"):
        SamplingParams(allowed_token_ids=[])


def _finals(engine) -> dict:
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished}
    return finals


def _word_at(tokenizer, tokens: list[int], length: int) -> tuple[str, int]:
    """A word that tokenizes to tokens[k:k + length] (as it is or with a leading space), at its first k."""
    for k in range(len(tokens) - length + 1):
        piece = tokens[k:k + length]
        if any(tokens[j:j + length] == piece for j in range(k)):
            continue
        params = SamplingParams(bad_words=[tokenizer.decode(piece)])
        params.update_from_tokenizer(tokenizer)
        if piece in params.bad_words_token_ids:
            return tokenizer.decode(piece), k
    raise AssertionError(f"no {length}-token word in {tokens}")


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_bad_words_are_banned_exactly_where_they_would_complete(tiny_model_with_tokenizer, async_scheduling):
    """Greedy rows: a one-token word changes the output first where that token was; a two-token word only after
    its first token was generated; a row beside them without bad words is unchanged."""
    engine = LLMEngine(EngineArgs(model=str(tiny_model_with_tokenizer), max_model_len=128, max_num_seqs=4,
                                  async_scheduling=async_scheduling))
    greedy = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompt = "The quick brown fox"
    engine.add_request("free", prompt, SamplingParams(**greedy))
    free = _finals(engine)["free"]
    one, at_one = _word_at(engine.tokenizer, free, 1)
    two, at_two = _word_at(engine.tokenizer, free, 2)
    engine.add_request("one", prompt, SamplingParams(bad_words=[one], **greedy))
    engine.add_request("two", prompt, SamplingParams(bad_words=[two], **greedy))
    engine.add_request("beside", prompt, SamplingParams(**greedy))
    got = _finals(engine)
    assert got["beside"] == free
    assert got["one"][:at_one] == free[:at_one] and free[at_one] not in got["one"]
    assert got["two"][:at_two + 1] == free[:at_two + 1] and got["two"][at_two + 1] != free[at_two + 1]
    pairs = set(zip(got["two"], got["two"][1:]))
    assert tuple(free[at_two:at_two + 2]) not in pairs


def test_bad_words_that_cannot_be_held_are_refused(tiny_model_with_tokenizer):
    engine = LLMEngine(EngineArgs(model=str(tiny_model_with_tokenizer), max_model_len=128, max_num_seqs=4))
    with pytest.raises(ValueError, match="bad_words: 'a b c d e f g h i j k l m n o p q' is 17 tokens"):
        engine.add_request("long", "Hi", SamplingParams(bad_words=["a b c d e f g h i j k l m n o p q"]))
    with pytest.raises(ValueError, match="bad_words: at most 64 token sequences"):
        engine.add_request("many", "Hi", SamplingParams(bad_words=[f"word{i}" for i in range(65)]))
    with pytest.raises(ValueError, match="bad_words must be a list of non-blank strings"):
        SamplingParams(bad_words=["ok", " "])
    assert not engine.has_unfinished_requests()


def test_priority_needs_the_priority_policy(tiny_model_dir):
    fcfs = make_engine(tiny_model_dir("llama2")[0])
    with pytest.raises(ValueError, match="priority 2 needs priority scheduling"):
        fcfs.add_request("p", [1, 2], PARAMS, priority=2)
    with pytest.raises(ValueError, match="priority must be an int, got 1.5"):
        fcfs.add_request("p", [1, 2], PARAMS, priority=1.5)
    fcfs.add_request("p", [1, 2], PARAMS, priority=0)
    make_engine(tiny_model_dir("llama2")[0], scheduling_policy="priority").add_request("p", [1, 2], PARAMS, priority=2)


def test_prompt_token_ids_must_be_integers_and_numpys_are_taken_as_ints(tiny_model_dir):
    import numpy as np

    engine = make_engine(tiny_model_dir("llama2")[0])
    _, token_ids = engine.tokenize(np.array([5, 6, 7], np.int64))
    assert token_ids == [5, 6, 7] and all(type(t) is int for t in token_ids)
    for bad in ([5, True], [5, 6.0], [5, "6"]):
        with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] = .* is not a token id: must be an int, got"):
            engine.tokenize({"prompt_token_ids": bad})


@pytest.mark.parametrize("prompt, message", [
    (5, "prompt must be text, a list of token ids or a prompt dict, got int"),
    (None, "prompt must be text, a list of token ids or a prompt dict, got NoneType"),
    ({"prompt_token_ids": 5}, "prompt_token_ids must be a list of token ids, got int"),
])
def test_a_prompt_that_holds_no_token_ids_is_a_value_error_naming_it(tiny_model_dir, prompt, message):
    engine = make_engine(tiny_model_dir("llama2")[0])
    with pytest.raises(ValueError, match=f"^{message}$"):
        engine.add_request("r", prompt, PARAMS)
    assert not engine.has_unfinished_requests()
