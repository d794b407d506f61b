"""Tool calling through the server: tool_choice "required" and a named function (enforced by structured outputs,
so even the tiny random model's calls are valid), "auto" read by --tool-call-parser, the reasoning split of
--reasoning-parser, streamed and not, with the openai client and LangChain; bad tools are 400s naming the field.

Replies the random model would not write by itself (a hermes call, a <think> block) are obtained by constraining
it with a regex: what is tested is how the server reads them."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from tests.server.helpers import MODEL, client

pytestmark = pytest.mark.slow
xgr = pytest.importorskip("xgrammar")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "required": ["city", "unit"],
                                                           "additionalProperties": False, "properties": {
                                                               "city": {"enum": ["Paris", "Oslo"]},
                                                               "unit": {"enum": ["C", "F"]}}}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "required": ["a", "b"], "additionalProperties": False,
    "properties": {"a": {"enum": [1, 2, 3]}, "b": {"type": "boolean"}}}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_CALL = r'<tool_call>\{"name": "add", "arguments": \{"a": [1-3], "b": (true|false)\}\}</tool_call>'


@pytest.fixture(scope="module")
def tool_server(start_module_server):
    return start_module_server("--max-model-len", "256", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                               "--structured-outputs-config", '{"disable_any_whitespace": true}')


@pytest.fixture(scope="module")
def reasoning_server(start_module_server):
    return start_module_server("--max-model-len", "256", "--reasoning-parser", "qwen3")


def check_calls(calls, tools=TOOLS) -> None:
    declared = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), declared[call["function"]["name"]])


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": ASK, "max_tokens": 120, **body})


def streamed(server, body: dict) -> tuple[dict, str | None]:
    """The stream's deltas reassembled: (message with content, reasoning_content, tool_calls), finish_reason."""
    calls: dict[int, dict] = {}
    content, reasoning, finish = [], [], None
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120, json={
            "model": MODEL, "messages": ASK, "max_tokens": 120, "stream": True, **body}) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or "")
            for item in delta.get("tool_calls") or []:
                call = calls.setdefault(item["index"], {"id": item.get("id"), "type": "function",
                                                        "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += item["function"].get("name") or ""
                call["function"]["arguments"] += item["function"].get("arguments") or ""
            finish = choice["finish_reason"] or finish
    message = {"content": "".join(content) or None, "reasoning_content": "".join(reasoning) or None,
               "tool_calls": [calls[i] for i in sorted(calls)]}
    return message, finish


def test_required_tool_choice_gives_valid_calls(tool_server):
    """One call (parallel_tool_calls false: a random model, free to add calls, may never close the list)."""
    openai_client = client(tool_server.url)
    for temperature in (0.0, 1.0):
        reply = openai_client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                      temperature=temperature, seed=5, max_tokens=120,
                                                      parallel_tool_calls=False)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = [call.model_dump() for call in choice.message.tool_calls]
        check_calls(calls)
        assert len(calls) == 1


def test_required_calls_are_closed_within_max_tokens(tool_server):
    """Several calls allowed: the random model goes on adding calls; before max_tokens runs out the server closes
    the JSON, so every call comes back whole and valid, the same streamed and not (finish_reason "length": the
    budget ended the reply)."""
    for max_tokens in (30, 45, 60):
        body = {"tools": TOOLS, "tool_choice": "required", "max_tokens": max_tokens, "temperature": 0}
        reply = post(tool_server, body).json()
        choice = reply["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "length" and reply["usage"]["completion_tokens"] <= max_tokens
        check_calls(calls)
        message, finish = streamed(tool_server, body)
        assert finish == "length" and [c["function"] for c in message["tool_calls"]] == \
            [c["function"] for c in calls]


def test_a_named_function_is_called(tool_server):
    body = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "add"}}, "temperature": 0.7,
            "seed": 2}
    reply = post(tool_server, body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and [c["function"]["name"] for c in choice["message"]["tool_calls"]] \
        == ["add"]
    check_calls(choice["message"]["tool_calls"])
    message, finish = streamed(tool_server, body)
    assert finish == "stop"
    assert [c["function"] for c in message["tool_calls"]] == [c["function"] for c in choice["message"]["tool_calls"]]


@pytest.mark.parametrize("body", [
    {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
    {"tools": TOOLS, "structured_outputs": {"regex": r"Let me check\. " + HERMES_CALL}},  # auto: the parser reads it
])
def test_streamed_calls_reassemble_into_the_whole_reply(tool_server, body):
    body = {**body, "temperature": 0}
    reply = post(tool_server, body).json()["choices"][0]
    message, finish = streamed(tool_server, body)
    assert finish == reply["finish_reason"] == "tool_calls"
    assert message["content"] == reply["message"]["content"]
    assert [c["function"] for c in message["tool_calls"]] == [c["function"] for c in reply["message"]["tool_calls"]]
    check_calls(reply["message"]["tool_calls"])
    if "structured_outputs" in body:
        assert reply["message"]["content"] == "Let me check."


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_the_openai_stream_helper_reassembles_the_whole_call_from_argument_pieces(tool_server, choice):
    """client.chat.completions.stream: the arguments arrive in several pieces (after the id and name), and the
    helper's final completion holds exactly the non-streamed reply's calls."""
    openai_client = client(tool_server.url)
    body = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=120,
                parallel_tool_calls=False)
    whole = openai_client.chat.completions.create(**body).choices[0]
    pieces = []
    with openai_client.chat.completions.stream(**body) as stream:
        for event in stream:
            if event.type == "chunk" and event.chunk.choices and event.chunk.choices[0].delta.tool_calls:
                [item] = event.chunk.choices[0].delta.tool_calls
                pieces.append((item.id, item.function.name, item.function.arguments))
        final = stream.get_final_completion().choices[0]
    assert pieces[0][:2] == (final.message.tool_calls[0].id, "get_weather" if isinstance(choice, dict) else
                             whole.message.tool_calls[0].function.name)
    assert len([p for p in pieces if p[2]]) >= 3 and all(p[0] is None for p in pieces[1:])
    assert final.finish_reason == whole.finish_reason
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    check_calls([c.model_dump() for c in final.message.tool_calls])


def test_auto_without_calls_is_plain_content(tool_server):
    reply = post(tool_server, {"tools": TOOLS, "structured_outputs": {"choice": ["No tool needed."]}})
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] == []
    assert choice["message"]["content"] == "No tool needed."


def test_a_tool_loop_with_the_openai_client(tool_server):
    """Call, tool result, answer: the assistant's call and the tool's reply render back through the template."""
    openai_client = client(tool_server.url)
    first = openai_client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                  parallel_tool_calls=False, temperature=0,
                                                  max_tokens=120).choices[0].message
    call = first.tool_calls[0]
    messages = [*ASK, first.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"}]
    answer = openai_client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                                   max_tokens=5, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_langchain_bind_tools(tool_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=tool_server.url + "/v1", api_key="unused", model=MODEL,
                                      temperature=0, max_tokens=120, max_retries=0)
    reply = llm.bind_tools(TOOLS, tool_choice="required", parallel_tool_calls=False).invoke("Weather in Oslo?")
    assert reply.tool_calls
    declared = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    for call in reply.tool_calls:
        jsonschema.validate(call["args"], declared[call["name"]])


def thinking(reasoning: str) -> dict:
    """The assistant's reply begun with `reasoning` (prefilled and echoed: the random model would not think)."""
    return {"messages": [*ASK, {"role": "assistant", "content": reasoning}], "continue_final_message": True,
            "add_generation_prompt": False, "echo": True}


def test_reasoning_is_returned_apart_and_the_constraint_applies_to_the_answer(reasoning_server):
    """A prefilled think section closed by the prompt: the reply's reasoning comes apart, and the regex constrains
    the answer after </think> (streamed the same)."""
    body = {**thinking("<think>abc</think>"), "structured_outputs": {"regex": "[a-z]{2,4}"}, "temperature": 0}
    choice = post(reasoning_server, body).json()["choices"][0]
    reasoning, content = choice["message"]["reasoning_content"], choice["message"]["content"]
    assert reasoning == "abc" and re.fullmatch("[a-z]{2,4}", content) and choice["finish_reason"] == "stop"
    message, finish = streamed(reasoning_server, body)
    assert (message["reasoning_content"], message["content"], finish) == (reasoning, content, "stop")


def test_a_constraint_waits_while_the_reply_is_still_reasoning(reasoning_server):
    """An open think section: the constraint does not bind the reasoning (the random model, never closing it,
    runs to max_tokens with free text); with thinking disabled it binds from the first token."""
    body = {**thinking("<think>"), "structured_outputs": {"regex": "[a-z]{2,4}"}, "temperature": 0,
            "max_tokens": 24}
    choice = post(reasoning_server, body).json()["choices"][0]
    assert choice["finish_reason"] == "length" and not choice["message"]["content"]
    assert not re.fullmatch("[a-z]{0,24}", choice["message"]["reasoning_content"])
    disabled = post(reasoning_server, {"structured_outputs": {"regex": "[a-z]{2,4}"}, "temperature": 0,
                                       "chat_template_kwargs": {"enable_thinking": False}}).json()["choices"][0]
    assert re.fullmatch("[a-z]{2,4}", disabled["message"]["content"]) and disabled["finish_reason"] == "stop"
    assert disabled["message"].get("reasoning_content") is None


@pytest.mark.parametrize("body, field, message", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objec"}}}],
      "tool_choice": "required"}, "tools", "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools", "declared twice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope' is not a declared tool"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot be combined with response_format"),
])
def test_bad_tools_are_400s_naming_the_field(tool_server, body, field, message):
    reply = post(tool_server, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and message in error["message"], error
    assert post(tool_server, {"max_tokens": 2}).status_code == 200


def test_auto_needs_the_servers_parser(server):
    reply = post(server, {"tools": TOOLS})
    assert reply.status_code == 400 and "--enable-auto-tool-choice" in reply.json()["error"]["message"]
    assert post(server, {"tools": TOOLS, "tool_choice": "none", "max_tokens": 2}).status_code == 200
