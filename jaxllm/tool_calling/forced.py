"""tool_choice "required" and named tool_choice, as vLLM serves them: the output is constrained by a JSON schema
(structured outputs), then read back into calls.

    "required"                          the output is a JSON array of one or more calls
                                        [{"name": "get_weather", "parameters": {"city": "Paris"}}, ...]
                                        (at most one when parallel_tool_calls is false, at most
                                        MAX_PARALLEL_CALLS otherwise)
    {"type": "function",                the output is the named function's arguments object
     "function": {"name": "get_weather"}}  {"city": "Paris"}

required_schema() / named_schema() build the schemas from the request's tools (validated first: tools.py); the
server marks the constraint close_within_budget, so that near the end of max_tokens or the context the output's JSON
is closed by forced tokens (structured_outputs/budget_closing.py) and every call comes back whole;
RequiredToolParser / NamedToolParser read an output back into calls, whole or as it streams (the name first,
then the arguments in pieces, as the auto parsers do).
"""

from __future__ import annotations

import copy
from typing import Any

from jaxllm.tool_calling.call_head import MORE, NO, STRING, WS, ArgumentsText, match_head
from jaxllm.tool_calling.stream import CallArguments, CallStart, Step, ToolParser

_NO_PARAMETERS = {"type": "object", "properties": {}}
MAX_PARALLEL_CALLS = 8  # a bound on one reply's calls: a small model at temperature 0 may repeat a call forever
_DEFINITIONS = ("$defs", "definitions")  # moved to the top of the required schema, where "#/$defs/..." points


def required_schema(tools: list[dict], *, parallel_tool_calls: bool = True) -> dict:
    """The schema of tool_choice "required": an array of calls, each {"name": one of the tools' names,
    "parameters": that tool's parameters}."""
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "maxItems": MAX_PARALLEL_CALLS if parallel_tool_calls else 1,
                              "items": {"type": "object", "anyOf": [_call_schema(tool) for tool in tools]}}
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


class RequiredToolParser(ToolParser):
    """The calls of a tool_choice "required" output, streamed: each call's name once read, then its parameters
    object's text as it arrives. The output is the schema's: an array of {"name", "parameters"} objects in that
    order (compact or not); what does not read as one ends the reading (an output cut by max_tokens gives the
    calls up to the cut, the last one's arguments cut too)."""

    name = "required"

    def scanner(self) -> "RequiredScanner":
        return RequiredScanner()


class NamedToolParser(ToolParser):
    """The one call of a named tool_choice: the output (the whitespace around it dropped) is its arguments,
    streamed as they arrive."""

    name = "named"

    def __init__(self, function: str):
        self.function = function

    def scanner(self) -> "NamedScanner":
        return NamedScanner(self.function)


class RequiredScanner:
    def __init__(self):
        self._state = _OPEN
        self._arguments: ArgumentsText | None = None

    def step(self, unread: str, final: bool) -> Step | None:
        if self._state == _ARGUMENTS:
            return self._streamed(unread, final)
        if self._state == _DONE:
            return (len(unread), []) if unread else None
        head = match_head(unread, _OPEN_ARRAY if self._state == _OPEN else _NEXT_ITEM, final)
        if head == MORE:
            return None
        if head == NO:
            self._state = _DONE
            return 0, []
        self._state, self._arguments = _ARGUMENTS, ArgumentsText(0)
        return head.arguments_at, [CallStart(head.name)]

    def _streamed(self, unread: str, final: bool) -> Step | None:
        step, over = self._arguments.scan(unread, final)
        if over:
            self._state, self._arguments = _NEXT, None
        return step


class NamedScanner:
    def __init__(self, function: str):
        self._function, self._started = function, False

    def step(self, unread: str, final: bool) -> Step | None:
        body = unread.rstrip()  # trailing whitespace: held back, dropped at the end
        if not self._started:
            space = len(unread) - len(unread.lstrip())
            if space:
                return space, []
            if not body:
                return None
            self._started = True
            return 0, [CallStart(self._function)]
        read = len(unread) if final else len(body)
        return (read, [CallArguments(body)]) if read else None


_OPEN, _NEXT, _ARGUMENTS, _DONE = "open", "next", "arguments", "done"
_ITEM = [WS, "{", WS, '"name"', WS, ":", WS, STRING, WS, ",", WS, '"parameters"', WS, ":", WS, "{"]
_OPEN_ARRAY = [WS, "["] + _ITEM
_NEXT_ITEM = [WS, "}", WS, ","] + _ITEM  # the previous call's closing "}", then the next call


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
