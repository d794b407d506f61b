"""ChatRenderer: the model's chat template rendered in a child process gives apply_chat_template's tokens, and a
template that loops, eats memory or fails is stopped within its bounds with an error naming the problem; the
renderer serves the next request after a kill."""

from __future__ import annotations

import copy
import time

import pytest
from jinja2 import TemplateError

from jaxllm.chat_renderer import ChatRenderer
from jaxllm.loaders import resolve_model
from jaxllm.tokenizer import load_tokenizer

LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
ON_REQUEST = "{% if messages[-1].content == 'hang' %}" + LOOP + "{% else %}{{ messages[-1].content }}{% endif %}"
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another, with émojis 🚀"}],
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_with_tokenizer):
    return load_tokenizer(resolve_model(str(tiny_model_with_tokenizer)))


def with_template(tokenizer, template: str):
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="module")
def renderer(tokenizer):
    renderer = ChatRenderer(tokenizer)
    yield renderer
    renderer.close()


@pytest.mark.parametrize("options", [{}, {"add_generation_prompt": False},
                                     {"add_generation_prompt": False, "continue_final_message": True}])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "four"])
def test_tokens_equal_apply_chat_template(renderer, tokenizer, conversation, options):
    want = tokenizer.encode(tokenizer.apply_chat_template(conversation, tokenize=False,
                                                          **{"add_generation_prompt": True, **options}),
                            add_special_tokens=False)
    assert renderer.prompt_ids(conversation, **options) == want


def test_a_looping_template_is_stopped_and_the_next_request_served(tokenizer):
    renderer = ChatRenderer(with_template(tokenizer, ON_REQUEST), timeout_s=1.0)
    renderer.start()
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"the chat template did not finish within 1 s on these messages"):
        renderer.prompt_ids([{"role": "user", "content": "hang"}])
    assert time.monotonic() - start < 5
    assert renderer.prompt_ids([{"role": "user", "content": "fine"}]) == tokenizer.encode(
        "fine", add_special_tokens=False)
    renderer.close()


@pytest.mark.parametrize("template, error", [
    ("{{ 'x' * 3000000000 }}", r"ran out of memory \(its bound: 1024 MiB\)"),
    ("{{ 'x' * 40000000 }}", r"the chat template's output is 40000000 characters on these messages; at most"),
])
def test_a_template_over_its_memory_or_output_bound_is_refused(tokenizer, template, error):
    renderer = ChatRenderer(with_template(tokenizer, template))
    with pytest.raises(ValueError, match=error):
        renderer.prompt_ids([{"role": "user", "content": "Hi"}])
    renderer.close()


@pytest.mark.parametrize("template, error", [
    ("{% for message in messages %}{{ message.content }", "TemplateSyntaxError: "),
    ("{{ raise_exception('only system messages, please') }}", "^only system messages, please$"),
    ("{{ messages[0].nothing.upper() }}", "UndefinedError: "),
])
def test_template_errors_keep_their_names(tokenizer, template, error):
    renderer = ChatRenderer(with_template(tokenizer, template))
    with pytest.raises(TemplateError, match=error):
        renderer.prompt_ids([{"role": "user", "content": "Hi"}])
    renderer.close()


def test_no_template_is_a_value_error(tokenizer):
    with pytest.raises(ValueError, match="this model's tokenizer has no chat template"):
        ChatRenderer(with_template(tokenizer, None)).prompt_ids([{"role": "user", "content": "Hi"}])


def test_generate_chat_names_a_template_error_in_one_line(tiny_model_with_tokenizer, tokenizer, tmp_path, capsys):
    import shutil

    from jaxllm.entrypoints.cli import main

    model = tmp_path / "model"
    shutil.copytree(tiny_model_with_tokenizer, model)
    with_template(tokenizer, "{{ raise_exception('no user messages here') }}").save_pretrained(str(model))
    assert main(["generate", "--chat", "Hi", "--model", str(model), "--max-model-len", "64"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1] == "jaxllm: error: the chat template failed: TemplateError: no user messages here", error
