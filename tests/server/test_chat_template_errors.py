"""A chat template that fails on the request's messages (or is itself broken) is a 400 naming the template error;
a failure that is not the template's (a bug) is not turned into a 400."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import pytest

from jaxllm.entrypoints.openai.errors import OpenAIError
from jaxllm.entrypoints.openai.protocol import ChatMessage
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
    engine = SimpleNamespace(engine=SimpleNamespace(scheduler_config=SimpleNamespace(max_model_len=64)))
    serving = ChatServing(engine, ["tiny"], ServerTokenizer(tokenizer))
    return asyncio.run(serving.render(MESSAGES))


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
