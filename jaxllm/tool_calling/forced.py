"""tool_choice "required" and named tool_choice, as vLLM serves them: the output is constrained by a JSON schema
(structured outputs), then read back into calls.

    "required"                          the output is a JSON array of one or more calls
                                        [{"name": "get_weather", "parameters": {"city": "Paris"}}, ...]
                                        (at most one when parallel_tool_calls is false)
    {"type": "function",                the output is the named function's arguments object
     "function": {"name": "get_weather"}}  {"city": "Paris"}

required_schema() / named_schema() build the schemas from the request's tools (validated first: tools.py);
calls_from_required_output() / calls_from_named_output() read an output back, and raise ValueError when it is not
what the schema asks for (an output cut short by max_tokens).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from jaxllm.tool_calling.calls import ToolCall, arguments_text, new_call_id

_NO_PARAMETERS = {"type": "object", "properties": {}}
_DEFINITIONS = ("$defs", "definitions")  # moved to the top of the required schema, where "#/$defs/..." points


def required_schema(tools: list[dict], *, parallel_tool_calls: bool = True) -> dict:
    """The schema of tool_choice "required": an array of calls, each {"name": one of the tools' names,
    "parameters": that tool's parameters}."""
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": [_call_schema(tool) for tool in tools]}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    for key in _DEFINITIONS:
        definitions = _merged_definitions(tools, key)
        if definitions:
            schema[key] = definitions
    return schema


def named_schema(tools: list[dict], name: str) -> dict:
    """The schema of a named tool_choice: the function's parameters."""
    for tool in tools:
        if tool["function"]["name"] == name:
            return copy.deepcopy(tool["function"].get("parameters") or _NO_PARAMETERS)
    raise ValueError(f"tool_choice.function.name: {name!r} is not a declared tool")


def calls_from_required_output(text: str) -> list[ToolCall]:
    """The calls of a tool_choice "required" output."""
    value = _json(text, "'required'")
    if not isinstance(value, list) or not value:
        raise ValueError("tool_choice 'required': the output is not a non-empty JSON array of calls")
    calls = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"tool_choice 'required': call {i} is not an object with a string `name`")
        arguments = arguments_text(item.get("parameters"))
        if arguments is None:
            raise ValueError(f"tool_choice 'required': call {i} has no `parameters` object")
        calls.append(ToolCall(id=new_call_id(), name=item["name"], arguments=arguments))
    return calls


def calls_from_named_output(name: str, text: str) -> list[ToolCall]:
    """The one call of a named tool_choice output: its arguments are the output's text (stripped of the
    whitespace around it), once read as a JSON object."""
    if not isinstance(_json(text, repr(name)), dict):
        raise ValueError(f"tool_choice {name!r}: the output is not a JSON object")
    return [ToolCall(id=new_call_id(), name=name, arguments=text.strip())]


def _call_schema(tool: dict) -> dict:
    function = tool["function"]
    parameters = copy.deepcopy(function.get("parameters") or _NO_PARAMETERS)
    for key in _DEFINITIONS:
        parameters.pop(key, None)
    return {"type": "object", "properties": {"name": {"type": "string", "enum": [function["name"]]},
                                             "parameters": parameters},
            "required": ["name", "parameters"], "additionalProperties": False}


def _merged_definitions(tools: list[dict], key: str) -> dict:
    """Every tool's `key` ($defs or definitions) in one; ValueError when two tools define a name differently."""
    merged: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        for name, definition in ((tool["function"].get("parameters") or {}).get(key) or {}).items():
            if name in merged and merged[name] != definition:
                raise ValueError(f"tools[{i}].function.parameters.{key}.{name}: differs from another tool's "
                                 f"definition of the same name (the required schema holds one of each)")
            merged[name] = copy.deepcopy(definition)
    return merged


def _json(text: str, choice: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"tool_choice {choice}: the output is not JSON ({e})") from None
