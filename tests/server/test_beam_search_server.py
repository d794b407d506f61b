"""use_beam_search on /v1/completions and /v1/chat/completions: the n choices are LLM.beam_search's n best
hypotheses (same model, same prompt), best first, streamed or not; fields beam search does not read, and bad
values, are 400s naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

from jaxllm.beam_search import BeamSearchParams
from jaxllm.chat_renderer import ChatRenderer
from jaxllm.llm import LLM
from tests.server.helpers import MODEL

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def server(start_module_server):
    """A server of its own, not warmed up (programs compile as the tests need them)."""
    return start_module_server("--max-num-seqs", "16", "--max-model-len", "256")


@pytest.fixture(scope="module")
def offline(tiny_model_with_tokenizer):
    return LLM(str(tiny_model_with_tokenizer), max_model_len=256)


def expected(offline, prompt, width, max_tokens, length_penalty=1.0):
    (output,) = offline.beam_search(prompt, BeamSearchParams(width, max_tokens, length_penalty=length_penalty))
    return [s.output_token_ids for s in output.sequences], [s.cum_logprob for s in output.sequences]


def post(server, path, body):
    return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)


@pytest.mark.parametrize("width,length_penalty", [(2, 1.0), (3, 0.5)])
def test_completion_choices_are_the_offline_beams(server, offline, width, length_penalty):
    tokens, cum = expected(offline, PROMPT, width, 6, length_penalty)
    reply = post(server, "/v1/completions", dict(prompt=PROMPT, max_tokens=6, n=width, use_beam_search=True,
                                                  length_penalty=length_penalty, return_token_ids=True,
                                                  logprobs=1))
    assert reply.status_code == 200, reply.text
    choices = reply.json()["choices"]
    assert [c["index"] for c in choices] == list(range(width))
    assert [c["token_ids"] for c in choices] == tokens
    tokenizer = offline.get_tokenizer()
    assert [c["text"] for c in choices] == [tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    assert all(c["finish_reason"] == "length" for c in choices)
    for choice, total in zip(choices, cum):  # each token's logprob, as its beam read it
        assert sum(choice["logprobs"]["token_logprobs"]) == pytest.approx(total, abs=1e-4)


def test_chat_choices_are_the_offline_beams_streamed_or_not(server, offline):
    prompt = {"prompt_token_ids": ChatRenderer(offline.get_tokenizer()).prompt_ids(MESSAGES)}  # as LLM.chat
    tokens, _ = expected(offline, prompt, 3, 5)
    body = dict(messages=MESSAGES, max_tokens=5, n=3, use_beam_search=True, return_token_ids=True)
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    assert [c["token_ids"] for c in reply.json()["choices"]] == tokens
    contents = [c["message"]["content"] for c in reply.json()["choices"]]

    streamed: dict[int, str] = {}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={"model": MODEL, **body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    streamed[choice["index"]] = streamed.get(choice["index"], "") + (choice["delta"].get("content")
                                                                                     or "")
    assert [streamed[i] for i in range(3)] == contents


def test_completion_stream_carries_the_beams(server, offline):
    tokens, _ = expected(offline, PROMPT, 2, 4)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "n": 2, "use_beam_search": True, "stream": True,
            "return_token_ids": True}
    got: dict[int, list[int]] = {}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    got.setdefault(choice["index"], []).extend(choice["token_ids"] or [])
    assert [got[i] for i in range(2)] == tokens


@pytest.mark.parametrize("extra,field", [
    (dict(top_p=0.5), "top_p"), (dict(stop=["x"]), "stop"), (dict(presence_penalty=1.0), "presence_penalty"),
    (dict(seed=3), "seed"), (dict(best_of=3), "best_of"), (dict(n=11), "n"), (dict(max_tokens=300), "max_tokens"),
    (dict(length_penalty="long"), "length_penalty"), (dict(length_penalty=float("inf")), "length_penalty"),
    (dict(response_format={"type": "json_object"}), "response_format"),
])
def test_what_beam_search_does_not_read_is_refused_by_name(server, extra, field):
    for path, body in (("/v1/completions", dict(prompt=PROMPT)), ("/v1/chat/completions", dict(messages=MESSAGES))):
        reply = httpx.post(server.url + path, content=json.dumps(
            {"model": MODEL, "max_tokens": 4, "n": 2, "use_beam_search": True, **body, **extra}),
            headers={"content-type": "application/json"}, timeout=120)
        assert reply.status_code == 400, (path, reply.text)
        assert reply.json()["error"]["param"] == field, reply.text


def test_length_penalty_without_beam_search_is_refused(server):
    reply = post(server, "/v1/completions", dict(prompt=PROMPT, max_tokens=2, length_penalty=0.5))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "length_penalty"
    assert post(server, "/v1/completions", dict(prompt=PROMPT, max_tokens=2, length_penalty=1.0)).status_code == 200
