"""Chat template options: a template of the user's own (a file or inline text), values for its variables, the tools
it lays out, and what is refused (syntax errors before anything runs, reserved names, sandbox escapes)."""

from __future__ import annotations

import pytest
from jinja2 import TemplateError

from jaxllm.chat_renderer import ChatRenderer
from jaxllm.chat_templates import load_chat_template, template_kwargs
from jaxllm.loaders import resolve_model
from jaxllm.tokenizer import load_tokenizer

CUSTOM = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
          "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
          "{% if tools %}[{% for t in tools %}{{ t.function.name }};{% endfor %}]{% endif %}"
          "{% if add_generation_prompt %}<assistant>{% endif %}")
HI = [{"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
ESCAPES = [  # the usual jinja2 sandbox payloads: reaching Python's internals from a template
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{% set x = messages.append({'role': 'user'}) %}{{ x }}",  # the immutable sandbox: no mutation
]


@pytest.fixture(scope="module")
def renderer(tiny_model_with_tokenizer):
    renderer = ChatRenderer(load_tokenizer(resolve_model(str(tiny_model_with_tokenizer))))
    yield renderer
    renderer.close()


def text(renderer, messages=HI, **options) -> str:
    return renderer.tokenizer.decode(renderer.prompt_ids(messages, **options))


def test_a_template_of_ones_own_with_variables_and_tools(renderer, tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(CUSTOM)
    assert load_chat_template(path) == CUSTOM == load_chat_template(CUSTOM)
    assert text(renderer, chat_template=CUSTOM) == "<user>Hi<assistant>"
    assert text(renderer, chat_template=CUSTOM, add_generation_prompt=False,
                template_kwargs={"enable_thinking": False}) == "<user>Hi/no_think"
    assert text(renderer, chat_template=CUSTOM, tools=TOOLS) == "<user>Hi[get_weather;add;]<assistant>"
    assert "<user>" not in text(renderer)  # the model's own template otherwise


def test_the_model_template_receives_tools_and_tool_messages(renderer):
    """SmolLM2's template ignores tools, but tool-call messages must still render (no error) through it."""
    messages = [*HI, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    assert "Hi" in text(renderer, messages, tools=TOOLS)


@pytest.mark.parametrize("value, message", [
    ("no/such/template.jinja", "is neither a file nor a Jinja template"),
    ("{% for m in messages %}{{ m.content }}", r"chat template: line 1: .*(for|end of template)"),
    ("{{ messages[0] | nosuchfilter }}", "chat template: line 1: .*nosuchfilter"),
])
def test_a_bad_template_is_refused_before_anything_runs(value, message):
    with pytest.raises(ValueError, match=message):
        load_chat_template(value)


@pytest.mark.parametrize("payload", ESCAPES)
def test_sandbox_escapes_are_template_errors(renderer, payload):
    with pytest.raises(TemplateError, match="(?i)security|unsafe|not safe|immutable|access"):
        text(renderer, chat_template=load_chat_template(payload))
    assert text(renderer, chat_template=CUSTOM) == "<user>Hi<assistant>"  # and the next render is served


def test_template_kwargs_merge_and_refuse_reserved_names():
    assert template_kwargs({"enable_thinking": True, "a": 1}, None, {"a": 2}) == {"enable_thinking": True, "a": 2}
    with pytest.raises(ValueError, match="chat_template_kwargs may not set add_generation_prompt, tokenize"):
        template_kwargs({"tokenize": True, "add_generation_prompt": False})
    with pytest.raises(ValueError, match="chat_template_kwargs must be an object"):
        template_kwargs(["enable_thinking"])


@pytest.mark.slow
def test_llm_chat_takes_the_template_options(tiny_model_with_tokenizer):
    from jaxllm import LLM, SamplingParams

    llm = LLM(str(tiny_model_with_tokenizer), max_model_len=128, max_num_seqs=2)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    kwargs = dict(chat_template=CUSTOM, tools=TOOLS, chat_template_kwargs={"enable_thinking": False},
                  add_generation_prompt=False)
    output = llm.chat(HI, params, use_tqdm=False, **kwargs)[0]
    expected = llm.get_tokenizer().encode("<user>Hi/no_think[get_weather;add;]", add_special_tokens=False)
    assert output.prompt_token_ids == expected
    with pytest.raises(ValueError, match="may not set tokenize"):
        llm.chat(HI, params, chat_template_kwargs={"tokenize": True})


@pytest.mark.parametrize("payload", ESCAPES)
def test_sandbox_escapes_in_the_models_own_template_are_template_errors(renderer, payload):
    """The model's template (tokenizer_config.json's chat_template) renders in the same sandbox."""
    import copy

    hostile = ChatRenderer(copy.deepcopy(renderer.tokenizer))
    hostile.tokenizer.chat_template = payload
    try:
        with pytest.raises(TemplateError, match="(?i)security|unsafe|not safe|immutable|access"):
            hostile.prompt_ids(HI)
    finally:
        hostile.close()


def hostile_model(source, target, payload: str):
    """A copy of a model directory whose tokenizer_config.json carries `payload` as its chat_template (and no
    chat_template.jinja beside it, which would win)."""
    import json
    import shutil

    shutil.copytree(source, target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = payload
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("payload", ESCAPES)
def test_sandbox_escapes_in_a_models_tokenizer_config_json_are_template_errors(tiny_model_with_tokenizer,
                                                                               tmp_path, payload):
    """The template a model ships in its tokenizer_config.json, loaded as any model's is, renders sandboxed."""
    model = hostile_model(tiny_model_with_tokenizer, tmp_path / "model", payload)
    tokenizer = load_tokenizer(resolve_model(str(model)))
    assert tokenizer.chat_template == payload  # the file's template is the one that runs
    hostile = ChatRenderer(tokenizer)
    try:
        with pytest.raises(TemplateError, match="(?i)security|unsafe|not safe|immutable|access"):
            hostile.prompt_ids(HI)
        assert hostile.tokenizer.decode(hostile.prompt_ids(HI, chat_template=CUSTOM)) == "<user>Hi<assistant>"
    finally:
        hostile.close()
