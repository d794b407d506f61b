"""tool_choice "required" and named: the schemas, checked with jsonschema against example outputs (and accepted by
xgrammar, the engine's structured-outputs backend, where it is installed), and outputs read back into calls."""

from __future__ import annotations

import json

import jsonschema
import pytest

from jaxllm.tool_calling import (calls_from_named_output, calls_from_required_output, named_schema, required_schema,
                                 validate_tools)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
        "required": ["city"], "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {"name": "send_mail", "parameters": {
        "type": "object", "properties": {"to": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                                         "body": {"type": "string"}},
        "required": ["to", "body"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now"}},  # no parameters: an empty object
]
GOOD = [
    [{"name": "get_weather", "parameters": {"city": "Paris"}}],
    [{"name": "get_weather", "parameters": {"city": "Zürich", "unit": "celsius"}},
     {"name": "send_mail", "parameters": {"to": ["ada@example.com"], "body": "日本語 🎉"}},
     {"name": "now", "parameters": {}}],
]
BAD = [
    [],  # no call
    [{"name": "get_time", "parameters": {}}],  # no such tool
    [{"name": "get_weather", "parameters": {"city": 5}}],  # the tool's parameters refuse it
    [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "kelvin"}}],  # through the moved $defs
    [{"name": "send_mail", "parameters": {"to": [], "body": "x"}}],
    [{"name": "now", "parameters": {}, "extra": 1}],
    [{"name": "now"}],
    {"name": "now", "parameters": {}},
]


def is_valid(schema, value) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(value)


def test_required_schema_accepts_calls_and_refuses_the_rest():
    validate_tools(TOOLS)
    schema = required_schema(TOOLS)
    jsonschema.validators.validator_for(schema).check_schema(schema)
    assert schema["$defs"] == {"unit": {"enum": ["celsius", "fahrenheit"]}}
    assert "$defs" in TOOLS[0]["function"]["parameters"]  # the tools are left as they were
    for output in GOOD:
        assert is_valid(schema, output), output
    for output in BAD:
        assert not is_valid(schema, output), output
    single = required_schema(TOOLS, parallel_tool_calls=False)
    assert is_valid(single, GOOD[0]) and not is_valid(single, GOOD[1])


@pytest.mark.parametrize("output", GOOD)
def test_a_required_output_parses_back_into_calls(output):
    text = json.dumps(output, ensure_ascii=False)
    assert is_valid(required_schema(TOOLS), json.loads(text))
    calls = calls_from_required_output(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(o["name"], o["parameters"]) for o in output]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    for call in calls:  # each call's arguments are valid under its own tool's parameters
        assert is_valid(named_schema(TOOLS, call.name), json.loads(call.arguments))


@pytest.mark.parametrize("text", ['[{"name": "now", "parameters": {', "[]", '{"name": "now", "parameters": {}}',
                                  '[{"name": "now"}]', '[{"parameters": {}}]', "not json"])
def test_a_bad_required_output_is_a_value_error(text):
    with pytest.raises(ValueError, match="tool_choice 'required'"):
        calls_from_required_output(text)


def test_named_schema_and_output():
    schema = named_schema(TOOLS, "send_mail")
    assert schema == TOOLS[1]["function"]["parameters"] and schema is not TOOLS[1]["function"]["parameters"]
    assert is_valid(schema, {"to": ["a@b.c"], "body": "hi"}) and not is_valid(schema, {"to": ["a@b.c"]})
    assert named_schema(TOOLS, "now") == {"type": "object", "properties": {}}
    with pytest.raises(ValueError, match="'get_time' is not a declared tool"):
        named_schema(TOOLS, "get_time")
    [call] = calls_from_named_output("get_weather", '\n{"city": "Paris"} ')
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}') and call.id.startswith("call_")
    for text in ('{"city": "Par', "[1]"):
        with pytest.raises(ValueError, match="tool_choice 'get_weather'"):
            calls_from_named_output("get_weather", text)


def test_definitions_that_differ_between_tools_are_refused():
    tools = [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "$defs": {"unit": {"enum": units}}, "properties": {"u": {"$ref": "#/$defs/unit"}}}}}
        for name, units in (("a", ["c"]), ("b", ["c"]), ("c", ["f"]))]
    assert required_schema(tools[:2])["$defs"] == {"unit": {"enum": ["c"]}}
    with pytest.raises(ValueError, match=r"tools\[2\].function.parameters.\$defs.unit: differs from another tool's"):
        required_schema(tools)


def test_xgrammar_takes_the_schemas():
    """The schemas compile to the engine's grammars, which accept the example outputs and refuse unknown names."""
    xgr = pytest.importorskip("xgrammar")
    accepts = getattr(getattr(xgr, "testing", None), "_is_grammar_accept_string", None)
    from jaxllm.structured_outputs import StructuredOutputsParams
    required = StructuredOutputsParams(json=required_schema(TOOLS)).parsed()
    named = StructuredOutputsParams(json=named_schema(TOOLS, "send_mail")).parsed()
    if accepts is None:
        pytest.skip("this xgrammar has no testing._is_grammar_accept_string")
    for output in GOOD:
        assert accepts(required, json.dumps(output, ensure_ascii=False))
    assert not accepts(required, json.dumps(BAD[1]))
    assert accepts(named, '{"to": ["a@b.c"], "body": "hi"}') and not accepts(named, '{"to": ["a@b.c"]}')
