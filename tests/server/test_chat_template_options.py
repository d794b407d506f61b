"""The server's chat template settings: --chat-template, --default-chat-template-kwargs, a request's own
chat_template (only with --trust-request-chat-template) and chat_template_kwargs, tools laid out by the template;
every refusal names its field, and a bad --chat-template stops the start before the model loads."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.server.helpers import MODEL
from tests.unit.test_chat_templates import CUSTOM, ESCAPES, TOOLS

pytestmark = pytest.mark.slow
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def templated(start_module_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(CUSTOM)
    return start_module_server("--max-model-len", "256", "--chat-template", str(path), "--default-chat-template-kwargs",
                               '{"enable_thinking": false}', "--trust-request-chat-template")


def rendered(server, **body) -> str:
    reply = httpx.post(server.url + "/tokenize", json={"model": MODEL, "messages": HI, "return_token_strs": True,
                                                       **body}, timeout=60)
    assert reply.status_code == 200, reply.text
    ids = reply.json()["tokens"]
    return httpx.post(server.url + "/detokenize", json={"model": MODEL, "tokens": ids}, timeout=60).json()["prompt"]


def refusal(server, path: str, body: dict) -> dict:
    reply = httpx.post(server.url + path, json={"model": MODEL, "messages": HI, "max_tokens": 2, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    return reply.json()["error"]


def test_the_servers_template_and_variables(templated):
    assert rendered(templated) == "<user>Hi/no_think<assistant>"
    assert rendered(templated, chat_template_kwargs={"enable_thinking": True}) == "<user>Hi<assistant>"
    assert rendered(templated, tools=TOOLS) == "<user>Hi/no_think[get_weather;add;]<assistant>"
    own = "{% for m in messages %}{{ m.content | upper }}{% endfor %}"
    assert rendered(templated, chat_template=own) == "HI"
    reply = httpx.post(templated.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": HI, "max_tokens": 3, "chat_template": own, "tools": TOOLS, "tool_choice": "none",
        "chat_template_kwargs": {"enable_thinking": True}})
    assert reply.status_code == 200, reply.text


def test_tool_messages_render_through_the_template(templated):
    messages = [*HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    own = ("{% for m in messages %}{{ m.role }}:{{ m.content }}"
           "{% for c in m.tool_calls or [] %}{{ c.function.name }}({{ c.function.arguments.a }}){% endfor %}"
           "{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %};{% endfor %}")
    assert rendered(templated, messages=messages, chat_template=own) == "user:Hi;assistant:add(1);tool:3#call_1;"


@pytest.mark.parametrize("body, field, message", [
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "may not set tokenize"),
    ({"chat_template_kwargs": ["x"]}, None, None),  # a type error: pydantic's 400
    ({"chat_template": "{% for %}"}, "chat_template", "chat template: line 1"),
    ({"chat_template": "/etc/passwd"}, "chat_template", "not a Jinja template"),
])
def test_bad_template_options_are_400s(templated, body, field, message):
    for path in ("/v1/chat/completions", "/tokenize"):
        error = refusal(templated, path, body)
        if field is not None:
            assert error["param"] == field and message in error["message"], error


@pytest.mark.parametrize("payload", ESCAPES)
def test_sandbox_escapes_are_400s_and_the_server_keeps_serving(templated, payload):
    error = refusal(templated, "/v1/chat/completions", {"chat_template": payload})
    assert error["param"] == "messages" and "chat template failed" in error["message"]
    assert rendered(templated) == "<user>Hi/no_think<assistant>"


def test_a_requests_own_template_needs_trust(server):
    error = refusal(server, "/v1/chat/completions", {"chat_template": "{{ messages[0].content }}"})
    assert error["param"] == "chat_template" and "--trust-request-chat-template" in error["message"]


@pytest.mark.parametrize("flags, message", [
    (["--chat-template", "{% for m in messages %}"], "chat template: line 1"),
    (["--chat-template", "no/such/file.jinja"], "is neither a file nor a Jinja template"),
    (["--default-chat-template-kwargs", '{"tokenize": true}'], "may not set tokenize"),
])
def test_a_bad_chat_setting_stops_the_start(tiny_model_with_tokenizer, flags, message):
    result = subprocess.run([sys.executable, "-m", "jaxllm.entrypoints.openai.api_server",
                             str(tiny_model_with_tokenizer), *flags], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.fixture(scope="module")
def escaping_flag_server(start_module_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("escape") / "chat.jinja"
    path.write_text(ESCAPES[1])  # valid Jinja: the flag takes it; rendering it is what the sandbox refuses
    return start_module_server("--max-model-len", "256", "--chat-template", str(path))


@pytest.fixture(scope="module")
def escaping_model_server(tiny_model_with_tokenizer, tmp_path_factory):
    from tests.server.conftest import ServerProcess
    from tests.unit.test_chat_templates import hostile_model

    model = hostile_model(tiny_model_with_tokenizer, tmp_path_factory.mktemp("hostile") / "model", ESCAPES[0])
    server = ServerProcess(model, tmp_path_factory.mktemp("server-log") / "server.log", "--max-model-len", "256",
                           "--no-warmup")
    yield server
    server.stop()


@pytest.mark.parametrize("which", ["escaping_flag_server", "escaping_model_server"])
def test_sandbox_escapes_through_the_flag_or_the_models_template_are_400s(request, which):
    """A --chat-template and a model's own tokenizer_config.json template that reach for Python's internals: each
    chat request is a 400 naming the template's failure, and the server keeps serving."""
    server = request.getfixturevalue(which)
    for _ in range(2):
        error = refusal(server, "/v1/chat/completions", {})
        assert error["param"] == "messages" and "SecurityError" in error["message"], error
    reply = httpx.post(server.url + "/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert reply.status_code == 200, reply.text
