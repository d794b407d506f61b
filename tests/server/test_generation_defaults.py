"""The server's sampling defaults from the generation config (vLLM's default_sampling_params): a field a request
leaves unset takes the generation config's value, a field it sends wins; a chat request without max_tokens
takes max_new_tokens, at most what the context leaves; a completion keeps the OpenAI default of 16."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import httpx
import pytest

from jaxllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from jaxllm.entrypoints.openai.serving_chat import ChatServing
from jaxllm.entrypoints.openai.tokenization import ServerTokenizer
from tests.server.helpers import MODEL

DEFAULTS = {"temperature": 0.25, "top_p": 0.5, "top_k": 7, "min_p": 0.05, "repetition_penalty": 1.1,
            "max_tokens": 3}
CHAT = [{"role": "user", "content": "Hello"}]


def _serving(defaults: dict, max_model_len: int = 64) -> ChatServing:
    engine = SimpleNamespace(engine=SimpleNamespace(scheduler_config=SimpleNamespace(max_model_len=max_model_len),
                                                    sampling_defaults=defaults, structured_outputs_config=None))
    return ChatServing(engine, [MODEL], ServerTokenizer(None))


def test_unset_fields_take_the_generation_config():
    request = ChatCompletionRequest(messages=CHAT)
    params = _serving(DEFAULTS).sampling_params(request, request.requested_max_tokens(), None)
    assert {name: getattr(params, name) for name in DEFAULTS} == DEFAULTS


def test_fields_the_request_sends_win():
    sent = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "max_tokens": 9}
    request = ChatCompletionRequest(messages=CHAT, **sent)
    params = _serving(DEFAULTS).sampling_params(request, request.requested_max_tokens(), None)
    assert (params.temperature, params.repetition_penalty, params.max_tokens) == (0.0, 1.0, 9)
    assert (params.top_p, params.top_k, params.min_p) == (1.0, 0, 0.0)
    one = ChatCompletionRequest(messages=CHAT, temperature=0.9, max_completion_tokens=4)
    params = _serving(DEFAULTS).sampling_params(one, one.requested_max_tokens(), None)
    assert (params.temperature, params.top_k, params.max_tokens) == (0.9, 7, 4)


def test_without_a_generation_config_the_protocol_defaults_stay():
    request = ChatCompletionRequest(messages=CHAT)
    params = _serving({}).sampling_params(request, request.requested_max_tokens(), None)
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (1.0, 1.0, 0, None)


def test_a_completion_without_max_tokens_keeps_the_openai_default():
    """serving_completion passes 16 for an unset max_tokens, as vLLM's CompletionRequest defaults it."""
    params = CompletionRequest(prompt="Hi").sampling_params(16, None, DEFAULTS)
    assert (params.max_tokens, params.temperature) == (16, 0.25)


def test_a_default_max_tokens_is_cut_to_the_context_left():
    serving = _serving({"max_tokens": 50}, max_model_len=64)
    request = ChatCompletionRequest(messages=CHAT)
    params = serving.sampling_params(request, None, None)
    assert serving.fit_default_max_tokens(params, 10).max_tokens == 50
    assert serving.fit_default_max_tokens(params, 20).max_tokens == 44


@pytest.fixture(scope="module")
def configured(start_module_server, tmp_path_factory):
    """A server whose --generation-config folder sets temperature, top_k and max_new_tokens; requests logged."""
    folder = tmp_path_factory.mktemp("generation-config")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.25, "top_k": 7,
                                                               "max_new_tokens": 3}))
    return start_module_server("--max-model-len", "128", "--generation-config", str(folder), "--enable-log-requests",
                               "--log-level", "info"), folder


def _post(server, path: str, body: dict) -> dict:
    reply = httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _logged_params(server) -> list[str]:
    """The SamplingParams of each request logged so far, in order."""
    return re.findall(r"prompt tokens .*?(SamplingParams\(.*)", server.log_path.read_text())


@pytest.mark.slow
def test_http_requests_take_the_generation_config_unless_they_send_the_field(configured):
    server, folder = configured
    assert f"default sampling parameters from {folder / 'generation_config.json'}: temperature=0.25, top_k=7, " \
           "max_tokens=3" in server.log_path.read_text()
    unset = _post(server, "/v1/chat/completions", {"messages": CHAT, "ignore_eos": True})
    sent = _post(server, "/v1/chat/completions", {"messages": CHAT, "ignore_eos": True, "temperature": 0.9,
                                                  "max_tokens": 5})
    completion = _post(server, "/v1/completions", {"prompt": "Hi", "ignore_eos": True})
    assert unset["usage"]["completion_tokens"] == 3 and sent["usage"]["completion_tokens"] == 5
    assert completion["usage"]["completion_tokens"] == 16
    logged = _logged_params(server)
    assert len(logged) == 3
    assert "temperature=0.25" in logged[0] and "top_k=7" in logged[0]
    assert "temperature=0.9" in logged[1] and "top_k=7" in logged[1]
    assert "temperature=0.25" in logged[2]
