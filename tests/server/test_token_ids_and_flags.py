"""vLLM's token-id fields (return_token_ids, return_tokens_as_token_ids), its bad_words and priority request fields,
and its optional server surface: --return-tokens-as-token-ids, --enable-prompt-tokens-details, GET /load
(--enable-server-load-tracking), GET /tokenizer_info (--enable-tokenizer-info-endpoint),
--enable-force-include-usage, --enable-per-request-metrics, --root-path with an API key from the environment,
and the ORCA load report header."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.server.helpers import MODEL

CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def flagged(start_module_server):
    """One batch slot, so that queued requests wait and the priority policy decides which runs next."""
    return start_module_server("--max-num-seqs", "1", "--max-model-len", "256", "--block-size", "8",
                               "--scheduling-policy", "priority", "--return-tokens-as-token-ids",
                               "--enable-prompt-tokens-details", "--enable-server-load-tracking",
                               "--enable-tokenizer-info-endpoint", "--enable-force-include-usage",
                               "--enable-per-request-metrics", "--root-path", "/llm", "--allowed-origins",
                               '["http://app.example"]', "--disable-fastapi-docs")


def post(server, path: str, body: dict) -> dict:
    reply = httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def events(server, path: str, body: dict) -> list[dict]:
    """A stream's events as parsed JSON (without [DONE])."""
    with httpx.stream("POST", server.url + path, json={"model": MODEL, "stream": True, **body}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def ids_of(tokens: list[str]) -> list[int]:
    assert all(t.startswith("token_id:") for t in tokens), tokens
    return [int(t.removeprefix("token_id:")) for t in tokens]


def tokenize(server, **body) -> list[int]:
    return post(server, "/tokenize", body)["tokens"]


def test_completion_token_ids(server):
    prompt = "Hello, world! How are you today?"
    body = dict(prompt=prompt, max_tokens=12, temperature=0, echo=True, logprobs=1, return_token_ids=True,
                return_tokens_as_token_ids=True)
    choice = post(server, "/v1/completions", body)["choices"][0]
    assert choice["prompt_token_ids"] == tokenize(server, prompt=prompt)
    logprob_ids = ids_of(choice["logprobs"]["tokens"])
    assert logprob_ids == choice["prompt_token_ids"] + choice["token_ids"]  # echo: the prompt's, then the reply's
    assert all(key.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"][1:] for key in top)
    assert choice["text"] == prompt + post(server, "/detokenize", {"tokens": choice["token_ids"]})["prompt"]

    chunks = events(server, "/v1/completions", {**body, "echo": False})
    assert chunks[0]["choices"][0]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed == choice["token_ids"]
    assert streamed == [t for c in chunks for t in ids_of(c["choices"][0]["logprobs"]["tokens"])]

    plain = post(server, "/v1/completions", {**body, "return_token_ids": False, "return_tokens_as_token_ids": False})
    assert plain["choices"][0]["token_ids"] is None and plain["choices"][0]["prompt_token_ids"] is None  # as vLLM
    assert not any(t.startswith("token_id:") for t in plain["choices"][0]["logprobs"]["tokens"])


def test_chat_token_ids(server):
    body = dict(messages=CHAT, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2, return_token_ids=True,
                return_tokens_as_token_ids=True)
    reply = post(server, "/v1/chat/completions", body)
    assert reply["prompt_token_ids"] == tokenize(server, messages=CHAT)
    choice = reply["choices"][0]
    assert ids_of([entry["token"] for entry in choice["logprobs"]["content"]]) == choice["token_ids"]
    assert all(top["token"].startswith("token_id:") for e in choice["logprobs"]["content"] for top in e["top_logprobs"])

    chunks = events(server, "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None})
    assert chunks[0]["prompt_token_ids"] == reply["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert all(isinstance(c["choices"][0]["token_ids"], list) for c in chunks if c["choices"])
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == choice["token_ids"]

    plain = post(server, "/v1/chat/completions", {**body, "return_token_ids": None})
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None  # null, as vLLM


def test_server_flag_writes_tokens_as_ids_unless_the_request_says_no(flagged):
    body = dict(prompt="The sky is", max_tokens=4, temperature=0, logprobs=0)
    by_flag = post(flagged, "/v1/completions", body)["choices"][0]["logprobs"]["tokens"]
    assert len(ids_of(by_flag)) == 4
    refused = post(flagged, "/v1/completions", {**body, "return_tokens_as_token_ids": False})
    assert not any(t.startswith("token_id:") for t in refused["choices"][0]["logprobs"]["tokens"])


def test_prompt_tokens_details_count_prefix_cache_hits(flagged, server):
    prompt = "A long shared beginning that fills a few blocks of eight tokens each, " * 3
    body = dict(prompt=prompt, max_tokens=2, temperature=0)
    first = post(flagged, "/v1/completions", body)["usage"]
    second = post(flagged, "/v1/completions", body)["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 8 == 0 and cached < second["prompt_tokens"]
    chat = events(flagged, "/v1/chat/completions", dict(messages=CHAT, max_tokens=2,
                                                        stream_options={"include_usage": True}))
    assert "cached_tokens" in chat[-1]["usage"]["prompt_tokens_details"]
    assert "prompt_tokens_details" not in post(server, "/v1/completions", body)["usage"]  # without the flag


@pytest.mark.slow
def test_load_counts_generation_requests_in_flight(flagged, server):
    """A request of 8 long samples that run one after another (one batch slot): /load reads 1 while it runs."""
    assert httpx.get(flagged.url + "/load", timeout=10).json() == {"server_load": 0}
    body = {"model": MODEL, "prompt": "Tell a story", "max_tokens": 240, "n": 8, "temperature": 1.0,
            "ignore_eos": True}
    request = threading.Thread(target=httpx.post, args=(flagged.url + "/v1/completions",), kwargs=dict(
        json=body, timeout=300))
    request.start()
    seen = set()
    while request.is_alive():
        seen.add(httpx.get(flagged.url + "/load", timeout=10).json()["server_load"])
    assert seen == {0, 1} or seen == {1}, seen
    assert httpx.get(flagged.url + "/load", timeout=10).json() == {"server_load": 0}
    assert httpx.get(server.url + "/load", timeout=10).status_code == 404  # without the flag


def test_tokenizer_info(flagged, server):
    info = httpx.get(flagged.url + "/tokenizer_info", timeout=10).json()
    assert isinstance(info["tokenizer_class"], str) and info["tokenizer_class"]
    assert info["eos_token"] == "<|im_end|>" and isinstance(info["chat_template"], str)
    for token_id, token in info["added_tokens_decoder"].items():
        assert int(token_id) >= 0 and isinstance(token["content"], str) and isinstance(token["special"], bool)
    assert httpx.get(server.url + "/tokenizer_info", timeout=10).status_code == 404  # without the flag


@pytest.mark.slow
def test_priority_decides_which_queued_request_runs_next(flagged, server):
    """One batch slot, busy with 8 long samples: a request sent later with a lower priority value starts before
    one sent earlier with a higher one (first come, first served would start the earlier one first)."""
    started: dict[str, float] = {}

    def stream(name: str, priority: int) -> None:
        body = {"model": MODEL, "prompt": f"Request {name}", "max_tokens": 4, "stream": True, "priority": priority}
        with httpx.stream("POST", flagged.url + "/v1/completions", json=body, timeout=300) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: {"):  # a completion stream's first event carries the first token
                    started.setdefault(name, time.monotonic())

    def busy() -> None:
        httpx.post(flagged.url + "/v1/completions", timeout=300, json={
            "model": MODEL, "prompt": "Tell a story", "max_tokens": 240, "n": 8, "temperature": 1.0,
            "ignore_eos": True})

    def start(target, *args) -> threading.Thread:
        """Start a request and wait until the server has it (GET /load counts it)."""
        before = httpx.get(flagged.url + "/load", timeout=10).json()["server_load"]
        thread = threading.Thread(target=target, args=args)
        thread.start()
        while httpx.get(flagged.url + "/load", timeout=10).json()["server_load"] == before:
            time.sleep(0.005)
        return thread

    threads = [start(busy), start(stream, "low", 10), start(stream, "high", -1)]
    assert threads[0].is_alive(), "the busy request ended before both others arrived: nothing was tested"
    for thread in threads:
        thread.join(300)
    assert started["high"] < started["low"], started
    refused = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "priority": 3},
                         timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"  # fcfs there


def test_bad_words_reach_the_engine(server):
    """A one-token word from the free-running reply: the reply is the same up to it, and never holds it."""
    body = dict(prompt="Once upon a time", max_tokens=12, temperature=0, return_token_ids=True)
    free = post(server, "/v1/completions", body)["choices"][0]["token_ids"]
    for at, token in enumerate(free):
        word = post(server, "/detokenize", {"tokens": [token]})["prompt"].lstrip()
        if word and [token] in (tokenize(server, prompt=word, add_special_tokens=False),
                                tokenize(server, prompt=" " + word, add_special_tokens=False)):
            break
    else:
        pytest.fail(f"no reply token reads back as a word: {free}")
    banned = post(server, "/v1/completions", {**body, "bad_words": [word]})["choices"][0]["token_ids"]
    assert banned[:at] == free[:at] and token not in banned
    too_long = httpx.post(server.url + "/v1/completions", json={"model": MODEL, **body, "bad_words": ["x " * 40]},
                          timeout=60)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "bad_words"


def test_stream_usage_follows_stream_options_and_the_force_flag(server, flagged):
    """vLLM's rule: a usage chunk only with include_usage (stream_options {} sends none); with
    --enable-force-include-usage every chunk carries the usage so far and a usage chunk ends the stream."""
    body = dict(prompt="Hi", max_tokens=3, temperature=0, ignore_eos=True)
    assert all(c.get("usage") is None for c in events(server, "/v1/completions", {**body, "stream_options": {}}))
    for path, request in (("/v1/completions", body),
                          ("/v1/chat/completions", {**body, "prompt": None, "messages": CHAT})):
        chunks = events(flagged, path, {k: v for k, v in request.items() if v is not None})
        assert all(c["usage"] is not None for c in chunks) and chunks[-1]["choices"] == []
        counts = [c["usage"]["completion_tokens"] for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 3


def test_per_request_metrics(flagged, server):
    reply = post(flagged, "/v1/chat/completions", dict(messages=CHAT, max_tokens=4, min_tokens=4, temperature=0))
    metrics = reply["metrics"]
    assert set(metrics) == {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
                            "tokens_per_second"}
    assert all(value >= 0 for value in metrics.values())
    assert metrics["mean_itl_ms"] == pytest.approx(metrics["generation_time_ms"] / 3)
    chunks = events(flagged, "/v1/completions", dict(prompt="Hi", max_tokens=2, temperature=0))
    assert "metrics" in chunks[-1] and all("metrics" not in c for c in chunks[:-1])
    one = post(flagged, "/v1/completions", dict(prompt="Hi", max_tokens=1, temperature=0))["metrics"]
    assert "mean_itl_ms" not in one and one["tokens_per_second"] > 0  # no inter-token latency for one token
    assert "metrics" not in post(flagged, "/v1/completions", dict(prompt="Hi", max_tokens=2, n=2))  # not one sequence
    assert "metrics" not in post(server, "/v1/chat/completions", dict(messages=CHAT, max_tokens=2))  # no flag


@pytest.mark.parametrize("report_format", ["TEXT", "JSON"])
def test_orca_load_report_header(server, report_format):
    reply = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                       headers={"endpoint-load-metrics-format": report_format}, timeout=60)
    header = reply.headers["endpoint-load-metrics"]
    assert header.startswith(report_format + " ")
    if report_format == "JSON":
        assert set(json.loads(header[5:])["named_metrics"]) == {"kv_cache_usage_perc", "num_requests_waiting"}
    else:
        assert "named_metrics.kv_cache_usage_perc=" in header and "named_metrics.num_requests_waiting=" in header
    assert "endpoint-load-metrics" not in httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "Hi", "max_tokens": 2}).headers


@pytest.mark.slow
def test_root_path_and_the_api_key_from_vllm_environment(start_test_server, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sekrit")
    keyed = start_test_server("--max-model-len", "128", "--root-path", "/llm", "--enable-log-requests", "--log-level",
                              "info")
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    for prefix in ("", "/llm"):
        url = keyed.url + prefix + "/v1/completions"
        assert httpx.post(url, json=body, timeout=60).status_code == 401
        assert httpx.post(url, json=body, headers={"Authorization": "Bearer sekrit"}, timeout=60).status_code == 200
        assert httpx.get(keyed.url + prefix + "/health", timeout=10).status_code == 200  # open without the key
    assert "prompt tokens [1], adapter None, priority 0, SamplingParams(" in keyed.log_path.read_text()  # logged


def test_cors_and_docs_flags(flagged, server):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    allowed = httpx.options(flagged.url + "/v1/completions", headers=preflight, timeout=10)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://app.example"
    other = httpx.options(flagged.url + "/v1/completions", headers={**preflight, "Origin": "http://evil.example"},
                          timeout=10)
    assert "access-control-allow-origin" not in other.headers
    assert "access-control-allow-origin" not in httpx.options(server.url + "/v1/completions", headers=preflight,
                                                              timeout=10).headers  # no CORS without the flag
    assert httpx.get(flagged.url + "/docs", timeout=10).status_code == 404
    assert httpx.get(server.url + "/docs", timeout=10).status_code == 200


@pytest.mark.parametrize("flags, error", [
    (["--allowed-origins", "*"], "argument --allowed-origins: not JSON"),
    (["--allowed-methods", '{"a": 1}'], "argument --allowed-methods: a JSON list of strings is needed"),
])
def test_cors_flags_take_json_lists(flags, error, capsys):
    from jaxllm.entrypoints.cli import main

    with pytest.raises(SystemExit):
        main(["serve", *flags])
    assert error in capsys.readouterr().err


def test_request_logging_flags_parse():
    from jaxllm.entrypoints.openai.api_server import add_serve_args
    import argparse

    parse = add_serve_args(argparse.ArgumentParser()).parse_args
    assert parse([]).enable_log_requests is False
    assert parse(["--enable-log-requests"]).enable_log_requests is True
    assert parse(["--enable-log-requests", "--disable-log-requests"]).enable_log_requests is False



def test_logprob_token_ids(server):
    """vLLM's logprob_token_ids: each position reports the asked ids' logprobs (raw, as the top-N would give
    them) and the sampled token's, whatever top_logprobs / logprobs ask."""
    base = dict(prompt="Hello", max_tokens=1, temperature=0, return_tokens_as_token_ids=True)
    free = post(server, "/v1/completions", {**base, "logprobs": 3})["choices"][0]["logprobs"]["top_logprobs"][0]
    top3 = {int(k.removeprefix("token_id:")): v for k, v in free.items()}
    asked = sorted(top3)[:2]
    choice = post(server, "/v1/completions", {**base, "logprobs": 5, "logprob_token_ids": asked + [5000],
                                              "allowed_token_ids": [42]})["choices"][0]
    assert choice["logprobs"]["tokens"] == ["token_id:42"]
    entries = choice["logprobs"]["top_logprobs"][0]
    assert set(entries) == {"token_id:42", *(f"token_id:{t}" for t in asked + [5000])}
    assert all(entries[f"token_id:{t}"] == pytest.approx(top3[t], abs=1e-5) for t in asked)
    chunks = events(server, "/v1/chat/completions", dict(messages=CHAT, max_tokens=1, temperature=0, logprobs=True,
                                                         logprob_token_ids=[5000], allowed_token_ids=[42],
                                                         return_tokens_as_token_ids=True))
    tops = [top["token"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
            for entry in c["choices"][0]["logprobs"]["content"] for top in entry["top_logprobs"]]
    assert set(tops) == {"token_id:42", "token_id:5000"}
    refused = httpx.post(server.url + "/v1/completions", json={"model": MODEL, **base, "logprob_token_ids": [7]},
                         timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "logprob_token_ids"
