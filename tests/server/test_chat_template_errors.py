"""A chat template that fails on the request's messages (or is itself broken) is a 400 naming the template error;
a failure that is not the template's (a bug) is not turned into a 400."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import pytest

from jaxllm.entrypoints.openai.errors import OpenAIError
from jaxllm.entrypoints.openai.protocol import ChatMessage, TokenizeRequest
from jaxllm.entrypoints.openai.serving_chat import ChatServing
from jaxllm.entrypoints.openai.tokenization import ServerTokenizer
from jaxllm.loaders import resolve_model
from jaxllm.tokenizer import load_tokenizer

MESSAGES = [ChatMessage(role="user", content="hi")]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_with_tokenizer):
    return load_tokenizer(resolve_model(str(tiny_model_with_tokenizer)))


def render(tokenizer, template: str | None = None):
    tokenizer = copy.deepcopy(tokenizer)
    if template is not None:
        tokenizer.chat_template = template
    engine = SimpleNamespace(engine=SimpleNamespace(scheduler_config=SimpleNamespace(max_model_len=64),
                                                 sampling_defaults={}, structured_outputs_config=None))
    serving = ChatServing(engine, ["tiny"], ServerTokenizer(tokenizer))
    return asyncio.run(serving.render(TokenizeRequest(messages=MESSAGES)))


@pytest.mark.parametrize("template, error", [
    ("{% for message in messages %}{{ message.content }", "TemplateSyntaxError"),  # broken template
    ("{{ raise_exception('only system messages, please') }}", "only system messages"),  # refuses the messages
    ("{{ messages[0].nothing.upper() }}", "UndefinedError"),  # fails on these messages
])
def test_template_errors_are_400_naming_the_problem(tokenizer, template, error):
    with pytest.raises(OpenAIError) as caught:
        render(tokenizer, template)
    assert caught.value.status == 400 and caught.value.param == "messages"
    assert error in caught.value.message and "chat template" in caught.value.message


def test_other_failures_are_not_blamed_on_the_request(tokenizer, monkeypatch):
    def broken_encode(*args, **kwargs):
        raise RuntimeError("a bug in encoding")

    monkeypatch.setattr(type(tokenizer), "encode", broken_encode)
    with pytest.raises(RuntimeError, match="a bug"):  # a 500 from the server's middleware, not a 400
        render(tokenizer)


def test_the_model_template_renders(tokenizer):
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
    assert render(tokenizer) == list(expected)


HANG = ("{% if messages[-1].content == 'hang' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
        "{% endfor %}{% else %}{{ messages[-1].content }}{% endif %}")


@pytest.fixture(scope="module")
def hostile_server(tiny_model_with_tokenizer, tokenizer, tmp_path_factory):
    """A model whose chat template loops for hours on the message "hang"."""
    import shutil

    from tests.server.conftest import ServerProcess

    model = tmp_path_factory.mktemp("hostile-template") / "model"
    shutil.copytree(tiny_model_with_tokenizer, model)
    hostile = copy.deepcopy(tokenizer)
    hostile.chat_template = HANG
    hostile.save_pretrained(str(model))
    server = ServerProcess(model, model.parent / "server.log", "--chat-template-timeout", "2", "--max-model-len",
                           "128", "--max-num-seqs", "4", "--max-num-batched-tokens", "64")  # a short warm-up
    yield server
    server.stop()


@pytest.mark.slow
def test_a_looping_template_fails_its_request_alone(hostile_server):
    """Two hanging chats fail with 400 after the template's bound; meanwhile completions are answered at once,
    and chat serves the next messages."""
    import threading
    import time

    import httpx

    url = hostile_server.url

    def chat(content: str) -> httpx.Response:
        return httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2})

    replies = []
    hanging = [threading.Thread(target=lambda: replies.append(chat("hang"))) for _ in range(2)]
    start = time.monotonic()
    for thread in hanging:
        thread.start()
    time.sleep(0.5)
    completion = httpx.post(url + "/v1/completions", timeout=60,
                            json={"model": "tiny", "prompt": "Hello there", "max_tokens": 2})
    assert completion.status_code == 200 and time.monotonic() - start < 2.0  # before the templates' bound
    for thread in hanging:
        thread.join(60)
    assert [r.status_code for r in replies] == [400, 400]
    assert all("the chat template did not finish within 2 s" in r.json()["error"]["message"] for r in replies)
    assert time.monotonic() - start < 15
    fine = chat("fine")
    assert fine.status_code == 200, fine.text
