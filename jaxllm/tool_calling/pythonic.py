"""pythonic: calls as a Python list of function calls (vLLM's `pythonic`: Llama 3.2 / 4, ToolACE and others).

    [get_weather(city="Paris", days=3), get_time(timezone='Europe/Paris', formats=["iso", "unix"])]

The list opens the output (after whitespace). Each call names a function and passes keyword arguments whose values
are Python literals (strings, numbers, True / False / None, and lists, tuples and dicts of them with string keys),
read with the ast module, never evaluated. What follows the list is content; a list that is not all such calls is
content, as is an output that does not open with "[".
"""

from __future__ import annotations

import ast
import json
from typing import Any

from jaxllm.tool_calling.brackets import PythonEnd
from jaxllm.tool_calling.markers import leading_space
from jaxllm.tool_calling.stream import Call, Content, Step, ToolParser

START, LIST, TEXT = "start", "list", "text"


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def scanner(self) -> PythonicScanner:
        return PythonicScanner()


class PythonicScanner:
    def __init__(self):
        self._state = START
        self._end: PythonEnd | None = None

    def step(self, unread: str, final: bool) -> Step | None:
        if self._state == START:
            return self._start(unread, final)
        if self._state == LIST:
            return self._list(unread, final)
        return (len(unread), [Content(unread)]) if unread else None

    def _start(self, unread: str, final: bool) -> Step | None:
        space = leading_space(unread)
        if space == len(unread) and not final:
            return None
        self._state = LIST if unread[space:space + 1] == "[" else TEXT
        return space, [Content(unread[:space])] if space else []

    def _list(self, unread: str, final: bool) -> Step | None:
        """The list, settled where its closing bracket is."""
        if self._end is None:
            self._end = PythonEnd()
        end = self._end.find(unread, final)
        if end is None and not final:
            return None
        self._state, self._end = TEXT, None
        if end is None:  # the output ended inside the list
            return len(unread), [Content(unread)]
        calls = parse_calls(unread[:end])
        return end, calls or [Content(unread[:end])]


def parse_calls(text: str) -> list[Call] | None:
    """The calls of a Python list of calls, or None unless it is one, and not empty."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):  # ValueError: a null character
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = [parse_call(node) for node in tree.elts]
    return None if None in calls else calls


def parse_call(node: ast.expr) -> Call | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if any(keyword.arg is None for keyword in node.keywords):  # **kwargs
        return None
    try:
        arguments = {keyword.arg: json_value(ast.literal_eval(keyword.value)) for keyword in node.keywords}
        return Call(node.func.id, json.dumps(arguments, ensure_ascii=False, allow_nan=False))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def json_value(value: Any) -> Any:
    """A literal as JSON would have it (tuples as lists); ValueError for what JSON has not (sets, bytes, complex
    numbers, keys that are not strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: json_value(item) for key, item in value.items()}
    raise ValueError(f"not a JSON value: {type(value).__name__}")
