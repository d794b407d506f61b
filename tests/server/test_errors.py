"""Bad requests get 4xx in the OpenAI error shape naming the problem, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.server.helpers import MODEL

LONG_PROMPT = list(range(1000, 1300))  # 300 token ids; the server's max_model_len is 256


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, timeout=60, **kwargs)


def assert_error(response: httpx.Response, status: int, *words: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def assert_still_serving(server) -> None:
    response = post(server, "/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2


COMPLETION_ERRORS = [
    ({"prompt": LONG_PROMPT, "max_tokens": 1}, "300", "256"),
    ({"prompt": list(range(1000, 1200)), "max_tokens": 100}, "200", "100", "256"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "logprobs": 1000}, "logprobs"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"prompt": ""}, "empty"),
    ({"prompt": []}, "empty"),
    ({"prompt": [5, 49152]}, "49152"),
    ({"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": {"not": "a prompt"}}, "prompt"),
    ({}, "prompt"),
]


@pytest.mark.parametrize("body_and_words", COMPLETION_ERRORS, ids=lambda case: str(case[0])[:40])
def test_completion_bad_input_is_400(server, body_and_words):
    body, *words = body_and_words
    assert_error(post(server, "/v1/completions", json={"model": MODEL, **body}), 400, *words)
    assert_still_serving(server)


def test_invalid_field_names_the_param(server):
    assert_error(post(server, "/v1/completions", json={"prompt": "x", "temperature": -2}), 400, param="temperature")
    assert_error(post(server, "/v1/completions", json={"prompt": "x", "max_tokens": "x"}), 400, param="max_tokens")


def test_chat_bad_input_is_400(server):
    too_long = [{"role": "user", "content": "word " * 400}]
    assert_error(post(server, "/v1/chat/completions", json={"messages": too_long}), 400, "256")
    assert_error(post(server, "/v1/chat/completions", json={"messages": []}), 400, "messages")
    assert_error(post(server, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "top_logprobs": 2}), 400, "logprobs")
    assert_error(post(server, "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "presence_penalty": 5}), 400, "presence_penalty")
    assert_still_serving(server)


def test_unknown_model_is_404(server):
    error = assert_error(post(server, "/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404, "gpt-9")
    assert error["code"] == "model_not_found"
    body = {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}
    assert_error(post(server, "/v1/chat/completions", json=body), 404, "gpt-9")
    assert_still_serving(server)


def test_malformed_json_is_400(server):
    headers = {"content-type": "application/json"}
    assert_error(post(server, "/v1/completions", content=b'{"prompt": "x", ', headers=headers), 400, "JSON")
    assert_error(post(server, "/v1/chat/completions", content=b"[1, 2]", headers=headers), 400)
    assert_still_serving(server)


def test_streaming_request_errors_before_streaming(server):
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 1, "stream": True}
    assert_error(post(server, "/v1/completions", json=body), 400, "300")
    assert_still_serving(server)


def test_detokenize_out_of_vocab_is_400(server):
    assert_error(post(server, "/detokenize", json={"tokens": [1, 10 ** 6]}), 400, "1000000")
    assert_still_serving(server)


def test_unknown_route_is_404_in_openai_shape(server):
    assert_error(httpx.get(server.url + "/v1/nothing"), 404)


def test_a_request_racing_an_adapter_unload_is_404():
    """The adapter was resolved by name, then unloaded before the engine took the request: 404, as for a name
    never served (not a 400: the request itself was fine)."""
    from jaxllm.entrypoints.openai.serving_base import _as_openai_error
    from jaxllm.lora.manager import AdapterRemovedError

    error = _as_openai_error(AdapterRemovedError("LoRA adapter id 3 was removed; give a new adapter a new id"))
    assert (error.status, error.param, error.code) == (404, "model", "model_not_found")
