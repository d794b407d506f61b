"""tool_choice "required" and named: the schemas, checked with jsonschema against example outputs (and accepted by
xgrammar, the engine's structured-outputs backend, where it is installed), the bound they add (at most
MAX_PARALLEL_CALLS calls), and outputs read back into calls, whole
and streamed in pieces."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from jaxllm.tool_calling import (MAX_PARALLEL_CALLS, NamedToolParser, RequiredToolParser, ToolCallDelta,
                                 assemble_tool_deltas, named_schema, required_schema, validate_tools)
from tests.tool_calling.helpers import check_delta_shapes, random_pieces, without_ids

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
    many = [{"name": "now", "parameters": {}}] * MAX_PARALLEL_CALLS
    assert is_valid(schema, many) and not is_valid(schema, many + many[:1])


def test_a_tool_schema_the_grammar_would_not_enforce_is_refused_naming_where():
    """uniqueItems is accepted by xgrammar and not enforced: a forced call could repeat an item, so the forced
    schema is refused (structured outputs' check), naming the keyword and where it sits."""
    from jaxllm.structured_outputs import StructuredOutputsParams

    pytest.importorskip("xgrammar")
    days = {"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "uniqueItems": True}
    tools = [{"type": "function", "function": {"name": "alarm", "parameters": {
        "type": "object", "properties": {"days": days}}}}]
    for schema, where in ((required_schema(tools), "items.anyOf[0].properties.parameters.properties.days"),
                          (named_schema(tools, "alarm"), "properties.days")):
        with pytest.raises(ValueError, match=rf"{re.escape(where)}: uniqueItems is not enforced"):
            StructuredOutputsParams(json=schema).parsed()
    assert tools[0]["function"]["parameters"]["properties"]["days"] == days  # the tools are left as they were


@pytest.mark.parametrize("output", GOOD)
@pytest.mark.parametrize("compact", [False, True])
def test_a_required_output_parses_back_into_calls(output, compact):
    text = json.dumps(output, ensure_ascii=False, indent=None if compact else 2,
                      separators=(",", ":") if compact else None)
    assert is_valid(required_schema(TOOLS), json.loads(text))
    calls = RequiredToolParser().extract(text).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(o["name"], o["parameters"]) for o in output]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert len({c.id for c in calls}) == len(calls)
    for call in calls:  # each call's arguments are valid under its own tool's parameters
        assert is_valid(named_schema(TOOLS, call.name), json.loads(call.arguments))


@pytest.mark.parametrize("text,calls", [
    ('[{"name": "now", "parameters": {', [("now", "{")]),  # cut by max_tokens: the call as far as it came
    ('[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "param', [("f", '{"a": 1}')]),
    ("[]", []), ('{"name": "now", "parameters": {}}', []), ('[{"name": "now"}]', []), ('[{"parameters": {}}]', []),
    ("not json", [])])
def test_a_required_output_that_is_not_the_schemas_gives_the_calls_begun(text, calls):
    assert without_ids(RequiredToolParser().extract(text)) == (None, calls)


@pytest.mark.parametrize("seed", range(3))
def test_forced_calls_stream_in_pieces_that_add_up_to_the_whole(seed):
    rng = random.Random(seed)
    for output in GOOD:
        text = json.dumps(output, ensure_ascii=False, indent=rng.choice([None, 2]))
        for parser, text in ((RequiredToolParser(), text),
                             (NamedToolParser("send_mail"), "\n " + json.dumps(output[-1]["parameters"]) + " \n")):
            stream, deltas = parser.stream(), []
            for piece in random_pieces(text, rng):
                deltas += stream.feed(piece)
            deltas += stream.finish()
            check_delta_shapes(deltas)
            assert without_ids(assemble_tool_deltas(deltas)) == without_ids(parser.extract(text))


def test_forced_arguments_arrive_as_they_are_generated():
    stream = RequiredToolParser().stream()
    assert stream.feed('[{"name": "get_wea') == []
    assert stream.feed('ther", "parameters": ') == []  # the head is settled by the arguments' opening
    head, first = stream.feed('{"city": "Pa')
    assert (head.index, head.name, head.arguments) == (0, "get_weather", "") and head.id.startswith("call_")
    assert first == ToolCallDelta(0, '{"city": "Pa') and stream.feed('ri') == [ToolCallDelta(0, "ri")]
    end, second, opening = stream.feed('s"}}, {"name": "now", "parameters": {')
    assert end == ToolCallDelta(0, 's"}') and (second.index, second.name) == (1, "now")
    assert opening == ToolCallDelta(1, "{") and stream.feed("}}]") == [ToolCallDelta(1, "}")]
    stream = NamedToolParser("now").stream()
    assert stream.feed(" \n") == []
    [head, first] = stream.feed('{"a": ')
    assert head.name == "now" and first == ToolCallDelta(0, '{"a":')  # trailing whitespace held back
    assert stream.feed("1} \n") == [ToolCallDelta(0, " 1}")] and stream.finish() == []


def test_named_schema_and_output():
    schema = named_schema(TOOLS, "send_mail")
    assert schema == TOOLS[1]["function"]["parameters"] and schema is not TOOLS[1]["function"]["parameters"]
    assert is_valid(schema, {"to": ["a@b.c"], "body": "hi"}) and not is_valid(schema, {"to": ["a@b.c"]})
    assert named_schema(TOOLS, "now") == {"type": "object", "properties": {}}
    with pytest.raises(ValueError, match="'get_time' is not a declared tool"):
        named_schema(TOOLS, "get_time")
    [call] = NamedToolParser("get_weather").extract('\n{"city": "Paris"} ').tool_calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}') and call.id.startswith("call_")
    assert without_ids(NamedToolParser("get_weather").extract(' {"city": "Par')) == (
        None, [("get_weather", '{"city": "Par')])  # cut by max_tokens
    assert without_ids(NamedToolParser("get_weather").extract(" \n ")) == (None, [])


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
