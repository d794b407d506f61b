"""pythonic: calls as a Python list of function calls (vLLM's `pythonic`: Llama 3.2 / 4, ToolACE and others).

    [get_weather(city="Paris", days=3), get_time(timezone='Europe/Paris', formats=["iso", "unix"])]

The list opens the output (after whitespace). Each call names a function and passes keyword arguments whose values
are Python literals (strings, numbers, True / False / None, and lists, tuples and dicts of them with string keys),
read with the ast module, never evaluated; the arguments are the JSON object of those values, in their order.
Inside the list, `#` comments and backslash-newlines are space, as Python reads them.
What follows the list is content, as is an output that does not open with "[".

A call streams: once `[get_weather(` (or `, get_time(` after a call) is read it is a call, and its arguments come
one keyword argument at a time, each converted to JSON once its value is complete (`{"city": "Paris"`, then
`, "days": 3}`). From the first text that is not a well-formed keyword argument, call or list separator (a value
that is no literal, a positional or repeated argument, a stray item), the call's arguments are closed with what
was read, and the rest of the output is content; so is an output that ends inside a call, from the argument it
ended in. A list whose first item does not open in that form (`[1, 2]`, `[ns.f(a=1)]`) is read whole: content
unless it is all well-formed calls.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from jaxllm.tool_calling.brackets import PythonEnd, PythonItemEnd
from jaxllm.tool_calling.call_head import IDENTIFIER, MORE, NO, PY_SPACE, Head, match_head, python_space
from jaxllm.tool_calling.markers import leading_space
from jaxllm.tool_calling.stream import Call, CallArguments, CallStart, Content, Step, ToolParser

FIRST_HEAD = ["[", PY_SPACE, IDENTIFIER, PY_SPACE, "("]
NEXT_HEAD = [PY_SPACE, ",", PY_SPACE, IDENTIFIER, PY_SPACE, "("]
KEYWORD = [PY_SPACE, IDENTIFIER, PY_SPACE, "="]  # a keyword argument's name; its value follows the "="
START, LIST, WHOLE, ARGUMENT, VALUE, AFTER_CALL, TEXT = ("start", "list", "whole", "argument", "value",
                                                         "after call", "text")
_VALUE_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def scanner(self) -> PythonicScanner:
        return PythonicScanner()


class PythonicScanner:
    def __init__(self):
        self._state = START
        self._end: PythonEnd | None = None  # WHOLE: the list's end; VALUE: the argument's
        self._keyword: Head | None = None  # VALUE: the argument's name, and where its "=" is
        self._names: list[str] = []  # the streamed call's arguments handed out so far

    def step(self, unread: str, final: bool) -> Step | None:
        return {START: self._start, LIST: self._list, WHOLE: self._whole, ARGUMENT: self._argument,
                VALUE: self._value, AFTER_CALL: self._after_call, TEXT: self._text}[self._state](unread, final)

    def _start(self, unread: str, final: bool) -> Step | None:
        space = leading_space(unread)
        if space == len(unread) and not final:
            return None
        self._state = LIST if unread[space:space + 1] == "[" else TEXT
        return space, [Content(unread[:space])] if space else []

    def _text(self, unread: str, final: bool) -> Step | None:
        return (len(unread), [Content(unread)]) if unread else None

    def _list(self, unread: str, final: bool) -> Step | None:
        """The list's opening: `[name(` starts a streamed call; any other list is read whole."""
        head = match_head(unread, FIRST_HEAD, final)
        if head == MORE:
            return None
        if head == NO:
            self._state = WHOLE
            return 0, []
        return self._call_start(head)

    def _call_start(self, head: Head) -> Step:
        self._state, self._names = ARGUMENT, []
        return head.arguments_at + 1, [CallStart(head.name)]

    def _whole(self, unread: str, final: bool) -> Step | None:
        """A list not in the streamed form, settled where its closing bracket is: its calls, or content."""
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

    def _argument(self, unread: str, final: bool) -> Step | None:
        """Inside a streamed call, before an argument: the call's ")", or a keyword argument's `name=`."""
        space = python_space(unread, 0, final)
        if space == MORE:
            return None
        if space == len(unread):
            return self._broken(0) if final else None
        if unread[space] == ")":
            self._state = AFTER_CALL
            return space + 1, [CallArguments(self._closing())]
        keyword = match_head(unread, KEYWORD, final)
        if keyword == MORE:
            return None
        if keyword == NO or keyword.name in self._names:
            return self._broken(0)
        self._state, self._keyword = VALUE, keyword
        self._end = PythonItemEnd(keyword.arguments_at + 1)
        return 0, []

    def _value(self, unread: str, final: bool) -> Step | None:
        """A keyword argument, settled where its value ends (at "," or the call's ")"): handed out as JSON."""
        end = self._end.find(unread, final)
        if end is None and not final:
            return None
        stop = len(unread) if end is None else end - 1
        value = value_json(unread[self._keyword.arguments_at + 1:stop])
        if end is None or value is None or unread[stop] not in ",)":
            return self._broken(0)
        piece = ("{" if not self._names else ", ") + json.dumps(self._keyword.name, ensure_ascii=False) + ": " + value
        self._names.append(self._keyword.name)
        self._state, self._end, self._keyword = ARGUMENT, None, None
        if unread[stop] == ")":
            self._state, piece = AFTER_CALL, piece + "}"
        return end, [CallArguments(piece)]

    def _after_call(self, unread: str, final: bool) -> Step | None:
        """After a streamed call: `, name(` starts the next one; "]" (maybe after a ",") closes the list;
        anything else is content."""
        space = python_space(unread, 0, final)
        if space == MORE or (space == len(unread) and not final):
            return None
        if unread[space:space + 1] == "]":
            self._state = TEXT
            return space + 1, []
        head = match_head(unread, NEXT_HEAD, final)
        if head == MORE:
            return None
        if head != NO:
            return self._call_start(head)
        if unread[space:space + 1] == ",":  # a trailing comma before the "]"
            after_comma = python_space(unread, space + 1, final)
            if after_comma == MORE:
                return None
            if unread[after_comma:after_comma + 1] == "]":
                self._state = TEXT
                return after_comma + 1, []
        self._state = TEXT
        return 0, []

    def _broken(self, read: int) -> Step:
        """The streamed call stops being well formed here: its arguments are closed, what follows is content."""
        self._state, self._end, self._keyword = TEXT, None, None
        return read, [CallArguments(self._closing())]

    def _closing(self) -> str:
        """The end of the streamed call's arguments object."""
        return "}" if self._names else "{}"


def value_json(text: str) -> str | None:
    """The JSON text of a keyword argument's value written as a Python literal (`text` as it stands between "="
    and the "," or ")" after it), as parse_call converts it; None when it is no such literal."""
    if not text.strip():
        return None
    try:  # in parentheses, as within the call: the value may span lines
        return json_text(ast.literal_eval("(" + text + "\n)"))
    except _VALUE_ERRORS:
        return None


def parse_calls(text: str) -> list[Call] | None:
    """The calls of a Python list of calls, or None unless it is one, and not empty."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # also a null character, nesting too deep
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = [parse_call(node) for node in tree.elts]
    return None if None in calls else calls


def parse_call(node: ast.expr) -> Call | None:
    """A call node as a Call; None unless it names a function and passes distinct keyword arguments whose values
    are literals JSON can hold."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    names = [keyword.arg for keyword in node.keywords]
    if None in names or len(set(names)) < len(names):  # **kwargs; a repeated argument (Python refuses it)
        return None
    try:
        arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords}
        return Call(node.func.id, json_text(arguments))
    except _VALUE_ERRORS:
        return None


def json_text(value: Any) -> str:
    """`value` as JSON text, as a call's arguments are written (non-ASCII kept; ValueError for NaN and infinities,
    and for what JSON has not)."""
    return json.dumps(json_value(value), ensure_ascii=False, allow_nan=False)


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
