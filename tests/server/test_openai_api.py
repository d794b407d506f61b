"""The API through the official openai client: completions, chat, streaming, n > 1, stop, logprobs, usage."""

from __future__ import annotations

import httpx
import pytest

from tests.server.helpers import MODEL, client, metrics


@pytest.fixture(scope="module")
def api(server):
    return client(server.url)


def test_models_version_health(server, api):
    models = api.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]


def test_completion_greedy_is_deterministic_and_counts_usage(api):
    first = api.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    again = api.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    choice = first.choices[0]
    assert choice.text and choice.text == again.choices[0].text
    assert choice.finish_reason == "length"
    assert first.usage.completion_tokens == 8
    assert first.usage.total_tokens == first.usage.prompt_tokens + 8
    assert first.object == "text_completion" and first.model == MODEL


def test_completion_prompt_forms_and_echo(api, server):
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": tokens}).json()["prompt"] == "Hello world"
    by_text = api.completions.create(model=MODEL, prompt="Hello world", max_tokens=5, temperature=0)
    by_ids = api.completions.create(model=MODEL, prompt=tokens, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = api.completions.create(model=MODEL, prompt=["Hello world", "Goodbye"], max_tokens=5, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text
    echoed = api.completions.create(model=MODEL, prompt="Hello world", max_tokens=5, temperature=0, echo=True)
    assert echoed.choices[0].text == "Hello world" + by_text.choices[0].text


def test_completion_n_seed_and_stop(api):
    out = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, n=3, temperature=1.0,
                                 seed=7)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert out.usage.completion_tokens == 36
    same = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, n=3, temperature=1.0,
                                  seed=7)
    assert [c.text for c in same.choices] == [c.text for c in out.choices]
    full = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0).choices[0]
    stop = full.text[len(full.text) // 2:][:4]
    assert stop.strip()
    cut = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0,
                                 stop=[stop]).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.index(stop)]
    kept = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0, stop=[stop],
                                  extra_body={"include_stop_str_in_output": True}).choices[0]
    assert kept.text == cut.text + stop


def test_best_of_returns_the_n_best_choices(api):
    kwargs = dict(model=MODEL, prompt="Pick", max_tokens=4, temperature=1.0, seed=3, logprobs=0)
    every = api.completions.create(**kwargs, n=6).choices  # the same 6 samples (seeds 3 .. 8)
    best = api.completions.create(**kwargs, n=2, best_of=6).choices
    totals = sorted((sum(c.logprobs.token_logprobs) for c in every), reverse=True)
    assert [c.index for c in best] == [0, 1]
    assert [sum(c.logprobs.token_logprobs) for c in best] == pytest.approx(totals[:2], abs=1e-4)
    chat = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Pick"}], n=2,
                                       max_completion_tokens=4, temperature=1.0, seed=3, extra_body={"best_of": 3})
    assert [c.index for c in chat.choices] == [0, 1]


def test_completion_logprobs(api):
    out = api.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=3).choices[0]
    lp = out.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == out.text
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and logprob <= 0
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)  # greedy: the sampled token is the top one
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(4)]


def test_streamed_logprob_offsets_are_cumulative_like_non_streamed(api):
    kwargs = dict(model=MODEL, prompt="Offsets", max_tokens=8, temperature=0, logprobs=1, echo=True)
    full = api.completions.create(**kwargs).choices[0].logprobs
    chunks = [c.choices[0] for c in api.completions.create(**kwargs, stream=True) if c.choices]
    streamed = [offset for chunk in chunks if chunk.logprobs for offset in chunk.logprobs.text_offset]
    assert streamed == full.text_offset
    assert streamed[0] == 0 and streamed == sorted(streamed)  # from the echoed prompt's first token, growing


def test_completion_stream_matches_non_stream(api):
    full = api.completions.create(model=MODEL, prompt="Streaming test", max_tokens=10, temperature=0)
    chunks = list(api.completions.create(model=MODEL, prompt="Streaming test", max_tokens=10, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_chat_and_chat_stream(api):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    out = api.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=8, temperature=0,
                                      logprobs=True, top_logprobs=2)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert out.usage.completion_tokens == 8 and choice.finish_reason == "length"
    assert len(choice.logprobs.content) == 8 and all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    chunks = list(api.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens and chunks[-1].usage.completion_tokens == 8


def test_chat_n_greater_than_one_streams_every_choice(api):
    chunks = list(api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                              max_tokens=5, temperature=0.8, seed=3, stream=True))
    texts = {0: "", 1: ""}
    finished = set()
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and all(texts.values())


STOPS_OFTEN = dict(extra_body={"stop_token_ids": list(range(0, 49152, 3))})  # samples stop at different steps


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_stream_reports_each_choice_finish_once(api, n, include_usage):
    common = dict(model=MODEL, n=n, max_tokens=12, temperature=1.0, seed=11, stream=True,
                  stream_options={"include_usage": include_usage}, **STOPS_OFTEN)
    streams = {"completions": list(api.completions.create(prompt="Count", **common)),
               "chat": list(api.chat.completions.create(messages=[{"role": "user", "content": "Count"}], **common))}
    for name, chunks in streams.items():
        finishes = [c.index for chunk in chunks for c in chunk.choices if c.finish_reason is not None]
        assert sorted(finishes) == list(range(n)), (name, finishes)
        usage_chunks = [chunk for chunk in chunks if chunk.usage is not None]
        assert usage_chunks == (chunks[-1:] if include_usage else []), name
        if include_usage:
            assert chunks[-1].choices == [] and 1 <= chunks[-1].usage.completion_tokens <= 12 * n


def test_tokenize_chat_messages(server):
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    out = httpx.post(server.url + "/tokenize", json=body).json()
    assert out["count"] == len(out["tokens"]) > 2 and out["max_model_len"] == 256


def test_metrics_count_requests_and_tokens(server, api):
    before = metrics(server.url)
    api.completions.create(model=MODEL, prompt="metrics", max_tokens=6, temperature=0)
    after = metrics(server.url)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 6
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]
    assert after['vllm:request_success_total{finished_reason="length"}'] > \
        before.get('vllm:request_success_total{finished_reason="length"}', 0)
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert after[f"vllm:{name}_count"] > before.get(f"vllm:{name}_count", 0)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert "vllm:prefix_cache_hits_total" in after and "vllm:num_requests_waiting" in after
