"""Tool definitions, assistant messages with tool_calls and tool results rendered by the chat templates of the
supported families, and each family's rendered call read back by its tool parser.

The real Llama 3.1, Qwen2.5 / Qwen3 and Mistral templates are not available offline, so each family is a small
template written here in that family's layout (its markers, where tools, calls and results go, and what it does
with arguments: `tojson` of an object); SmolLM2's is the real one, from the default model's GGUF. The messages
reach the templates as the server hands them over (ChatMessage.as_template_input: a call's arguments text
becomes an object, as vLLM does)."""

from __future__ import annotations

import json

import pytest
from jinja2 import TemplateError

from jaxllm.chat_renderer import ChatRenderer
from jaxllm.entrypoints.openai.protocol import ChatCompletionRequest
from jaxllm.loaders import resolve_model
from jaxllm.tokenizer import load_tokenizer
from jaxllm.tool_calling import get_tool_parser

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
ARGUMENTS = {"a": 1, "b": 2}

LLAMA31 = (  # tools in the user turn as JSON; a call as {"name", "parameters"}; results in an ipython turn
    "<|begin_of_text|>{% for m in messages %}"
    "{% if m.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>\n\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{{ m.content }}<|eot_id|>"
    "{% elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% for c in m.tool_calls %}{\"name\": \"{{ c.function.name }}\", \"parameters\": "
    "{{ c.function.arguments | tojson }}}{% endfor %}<|eom_id|>"
    "{% elif m.role in ('tool', 'ipython') %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
HERMES = (  # Qwen2.5 / Qwen3: tools in the system turn; calls in <tool_call>; results as <tool_response> user turns
    "{% if tools %}<|im_start|>system\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% endif %}{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MISTRAL = (  # tools before the last user turn; calls as [TOOL_CALLS] with 9-character ids; results with call_id
    "<s>{% set last = namespace(user=0) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set last.user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m.role == 'user' %}"
    "{% if tools and loop.index0 == last.user %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST]{{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{% if c.id is not defined or c.id | length != 9 %}{{ raise_exception('Tool call IDs should be "
    "alphanumeric strings with length 9!') }}{% endif %}"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}, \"id\": "
    "\"{{ c.id }}\"}{% if not loop.last %}, {% endif %}{% endfor %}]</s>"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{\"content\": {{ m.content | tojson }}, \"call_id\": "
    "\"{{ m.tool_call_id }}\"}[/TOOL_RESULTS]"
    "{% else %}{{ m.content }}</s>{% endif %}{% endfor %}")
FAMILIES = {"llama3_json": LLAMA31, "hermes": HERMES, "mistral": MISTRAL}


@pytest.fixture(scope="module")
def renderer(tiny_model_with_tokenizer):
    renderer = ChatRenderer(load_tokenizer(resolve_model(str(tiny_model_with_tokenizer))))
    yield renderer
    renderer.close()


def conversation(call_id: str = "abcDEF123") -> list[dict]:
    """A tool loop as a client sends it back: question, the assistant's call (arguments as JSON text), the result."""
    request = ChatCompletionRequest(model="m", tools=[ADD], messages=[
        {"role": "user", "content": "What is 1 + 2?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "add", "arguments": json.dumps(ARGUMENTS)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "3"}])
    return [m.as_template_input() for m in request.messages]


def rendered(renderer, template: str | None, messages: list[dict]) -> str:
    ids = renderer.prompt_ids(messages, chat_template=template, tools=[ADD])
    return renderer.tokenizer.decode(ids)


def assistant_turn(parser: str, text: str) -> str:
    """The assistant's turn of a rendered conversation, as the model wrote it (its call)."""
    start = {"llama3_json": "<|start_header_id|>assistant<|end_header_id|>\n\n", "hermes": "<|im_start|>assistant\n",
             "mistral": "[/INST]"}[parser]
    end = {"llama3_json": "<|eom_id|>", "hermes": "<|im_end|>", "mistral": "</s>"}[parser]
    return text.split(start, 1)[1].split(end, 1)[0]


@pytest.mark.parametrize("parser", FAMILIES)
def test_each_family_renders_tools_calls_and_results_and_its_parser_reads_the_call_back(renderer, parser):
    text = rendered(renderer, FAMILIES[parser], conversation())
    assert '"name": "add"' in text and '"description": "Add two integers"' in text  # the tool definitions
    assert {"llama3_json": "<|start_header_id|>ipython<|end_header_id|>\n\n3<|eot_id|>",
            "hermes": "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>",
            "mistral": '[TOOL_RESULTS]{"content": "3", "call_id": "abcDEF123"}[/TOOL_RESULTS]'}[parser] in text
    extracted = get_tool_parser(parser).extract(assistant_turn(parser, text))
    assert [(c.name, json.loads(c.arguments)) for c in extracted.tool_calls] == [("add", ARGUMENTS)]
    assert not extracted.content
    assert text.endswith({"llama3_json": "<|start_header_id|>assistant<|end_header_id|>\n\n",
                          "hermes": "<|im_start|>assistant\n", "mistral": "[/TOOL_RESULTS]"}[parser])


def test_arguments_reach_the_template_as_an_object(renderer):
    """`tojson` of the arguments writes the object once, never the JSON text of a string ("{\\"a\\": 1, ...}")."""
    text = rendered(renderer, HERMES, conversation())
    assert '"arguments": {"a": 1, "b": 2}' in text and '\\"a\\"' not in text


def test_mistrals_template_refuses_other_call_ids(renderer):
    with pytest.raises(TemplateError, match="length 9"):
        rendered(renderer, MISTRAL, conversation(call_id="call_" + "x" * 24))


def test_smollm2s_own_template_renders_a_tool_loop(renderer):
    """The default model's ChatML template (from its GGUF) has no tool layout: the tool result is a `tool` turn
    and the conversation goes on to the assistant's next turn."""
    text = rendered(renderer, None, conversation())
    assert "<|im_start|>user\nWhat is 1 + 2?<|im_end|>" in text
    assert "<|im_start|>tool\n3<|im_end|>" in text
    assert text.index("<|im_start|>assistant") < text.index("<|im_start|>tool")
    assert text.endswith("<|im_start|>assistant\n")
