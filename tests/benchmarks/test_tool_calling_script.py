"""benchmarks/tool_calling.py without a server: its tool sets are tools the server accepts (and whose forced-call
schemas xgrammar compiles), and its validity check says what a reply's problem is."""

from __future__ import annotations

import argparse
import json

import jsonschema
import pytest

from jaxllm.tool_calling.forced import named_schema, required_schema
from jaxllm.tool_calling.tools import validate_tools
from tests.benchmarks.scripts import load_script


script = load_script("tool_calling")


def test_tool_sets_are_varied_and_accepted():
    assert len(script.TOOL_SETS) >= 20
    for tools, message in script.TOOL_SETS:
        assert 1 <= len(tools) <= 5 and message
        validate_tools(tools)
        for tool in tools:
            jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
    text = json.dumps(script.TOOL_SETS)
    for feature in ('"$ref"', '"enum"', '"boolean"', '"number"', '"minimum"', '"array"', '"pattern"'):
        assert feature in text


def test_forced_call_schemas_compile():
    xgr = pytest.importorskip("xgrammar")
    for tools, _ in script.TOOL_SETS:
        for any_whitespace in (True, False):
            for schema in (required_schema(tools), required_schema(tools, parallel_tool_calls=False),
                           named_schema(tools, tools[0]["function"]["name"])):
                xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=any_whitespace)


def test_reply_problems():
    tools = [script.WEATHER]
    assert script.reply_problem([("get_weather", '{"city": "Oslo"}')], "tool_calls", tools) is None
    assert script.reply_problem([("get_weather", '{"city": "Oslo"}')], "length", tools) is None  # closed in time
    assert script.reply_problem([("get_weather", '{"city": "Os')], "length", tools) == \
        "cut by max_tokens: arguments not JSON"
    assert script.reply_problem([], "stop", tools) == "no calls"
    assert script.reply_problem([("get_time", "{}")], "tool_calls", tools) == "undeclared tool"
    assert script.reply_problem([("get_weather", '{"city": ')], "tool_calls", tools) == "arguments not JSON"
    assert script.reply_problem([("get_weather", '{"unit": "kelvin"}')], "tool_calls",
                                tools).startswith("schema: ")
    assert script.reply_problem([("get_weather", '{"city": "A"}')] * 2, "tool_calls", tools, single=True) \
        == "several calls with parallel_tool_calls=false"


def test_unset_sampling_and_length_are_not_sent():
    """'unset' leaves temperature, seed and max_tokens out of the request, as an unchanged client does."""
    tools, message = script.TOOL_SETS[0]
    unset = argparse.Namespace(max_tokens=script.max_tokens_arg("unset"), seed=7)
    body = script.request_body(tools, message, "required", script.temperature_arg("unset"), unset)
    assert not {"max_tokens", "temperature", "seed"} & set(body) and body["tool_choice"] == "required"
    given = argparse.Namespace(max_tokens=script.max_tokens_arg("64"), seed=7)
    body = script.request_body(tools, message, "required", script.temperature_arg("0.5"), given)
    assert (body["max_tokens"], body["temperature"], body["seed"]) == (64, 0.5, 7)
