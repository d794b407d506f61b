"""validate_tools / validate_tool_choice: what OpenAI's API accepts passes, each refusal names the field and the
problem."""

from __future__ import annotations

import pytest

from jaxllm.tool_calling import validate_tool_choice, validate_tools


def tool(name="get_weather", **function):
    return {"type": "function", "function": {"name": name, **function}}


WEATHER = tool(description="The weather in a city", parameters={
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]})


@pytest.mark.parametrize("tools", [
    [WEATHER],
    [tool("now"), tool("A-b_9" * 12 + "abcd", parameters={}), tool("x", strict=True, description=None)],
    # the draft the schema names; $defs and references
    [tool(parameters={"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                      "definitions": {"unit": {"enum": ["c", "f"]}},
                      "properties": {"unit": {"$ref": "#/definitions/unit"}}, "dependencies": {"a": ["b"]}})],
    [tool(parameters={"type": "object", "$defs": {"p": {"type": "object", "properties": {"x": {"type": "number"}}}},
                      "properties": {"p": {"$ref": "#/$defs/p"}}})],
])
def test_valid_tools_pass(tools):
    validate_tools(tools)


@pytest.mark.parametrize("tools,message", [
    ({"type": "function"}, "tools: expected a list, got dict"),
    ([], "tools: an empty list"),
    ([WEATHER, "get_time"], "tools[1]: expected an object, got str"),
    ([{"type": "retrieval"}], "tools[0].type: expected 'function', got 'retrieval'"),
    ([{"function": {"name": "f"}}], "tools[0].type: expected 'function', got None"),
    ([{"type": "function"}], "tools[0].function: expected an object, got null"),
    ([tool("get weather")], r"tools[0].function.name: 'get weather' does not match ^[a-zA-Z0-9_-]{1,64}$"),
    ([tool("")], "tools[0].function.name: '' does not match"),
    ([tool("a" * 65)], "tools[0].function.name: 'aaaa"),
    ([tool("é")], "tools[0].function.name: 'é' does not match"),
    ([tool(None)], "tools[0].function.name: None does not match"),
    ([tool(description=5)], "tools[0].function.description: expected a string, got int"),
    ([tool(strict="yes")], "tools[0].function.strict: expected true or false, got str"),
    ([WEATHER, tool("f", parameters="object")], "tools[1].function.parameters: expected a JSON Schema object, got str"),
    ([tool(parameters={"type": "array", "items": {}})],
     "tools[0].function.parameters: the arguments are an object: expected type 'object', got 'array'"),
    ([WEATHER, tool("a"), tool("b", parameters={"type": "object", "properties": {"x": {"type": "strng"}}})],
     "tools[2].function.parameters: not a valid JSON Schema: 'strng' is not valid under any of the given schemas "
     "(at properties/x/type)"),
    ([tool(parameters={"type": "object", "required": "city"})],
     "tools[0].function.parameters: not a valid JSON Schema: 'city' is not of type 'array' (at required)"),
    ([tool(parameters={"type": "object", "properties": {"n": {"type": "integer", "minimum": "0"}}})],
     "tools[0].function.parameters: not a valid JSON Schema: '0' is not of type 'number' (at properties/n/minimum)"),
    ([tool("a"), tool("b"), tool("a")], "tools[2].function.name: 'a' is declared twice (also tools[0])"),
])
def test_refusals_name_the_field(tools, message):
    with pytest.raises(ValueError) as refusal:
        validate_tools(tools)
    assert str(refusal.value).startswith(message), str(refusal.value)


@pytest.mark.parametrize("tool_choice,tools", [
    (None, None), ("none", None), ("auto", None), ("none", [WEATHER]), ("auto", [WEATHER]), ("required", [WEATHER]),
    ({"type": "function", "function": {"name": "get_weather"}}, [tool("now"), WEATHER]),
])
def test_valid_tool_choices_pass(tool_choice, tools):
    validate_tool_choice(tool_choice, tools)


@pytest.mark.parametrize("tool_choice,tools,message", [
    ("any", [WEATHER], "tool_choice: 'any' is not one of 'none', 'auto', 'required' or a function"),
    (3, [WEATHER], "tool_choice: expected a string or an object, got int"),
    ("required", None, "tool_choice: 'required' needs tools, and the request declares none"),
    ({"type": "tool", "function": {"name": "get_weather"}}, [WEATHER],
     "tool_choice.type: expected 'function', got 'tool'"),
    ({"type": "function"}, [WEATHER], "tool_choice.function: expected an object with a string `name`"),
    ({"type": "function", "function": {"name": "get_time"}}, [WEATHER, tool("now")],
     "tool_choice.function.name: 'get_time' is not a declared tool (the declared ones are get_weather, now)"),
    ({"type": "function", "function": {"name": "get_time"}}, None,
     "tool_choice.function.name: 'get_time' is not a declared tool (the request declares none)"),
])
def test_tool_choice_refusals(tool_choice, tools, message):
    with pytest.raises(ValueError) as refusal:
        validate_tool_choice(tool_choice, tools)
    assert str(refusal.value) == message
