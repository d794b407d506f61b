"""llama3_json: Llama 3.1 / 3.2 / 3.3 / 4 JSON tool calls (vLLM's `llama3_json`, and its alias `llama4_json`).

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

A call is a JSON object {"name": string, "parameters" or "arguments": object}; several are separated by ";".
Written in that order, a call streams: once `{"name": "get_weather", "parameters": {` is read it is a call, and its
arguments are the object's text as written (the call object's closing "}" is then expected; anything else after
the arguments is content). A call in another order is read whole at its end.
Calls open the output (after whitespace) or follow <|python_tag|> (text before the tag is content). What follows
the last call is content. An object that is no call is content, as is what follows it up to the next
<|python_tag|> (the tag included when no call follows it: <|python_tag|> also opens Llama's code interpreter
calls, which are not JSON).
"""

from __future__ import annotations

import json

from jaxllm.tool_calling.brackets import JsonEnd
from jaxllm.tool_calling.call_head import MORE, NO, STRING, WS, ArgumentsText, match_head
from jaxllm.tool_calling.calls import arguments_text
from jaxllm.tool_calling.markers import leading_space, starts_with, text_before_marker
from jaxllm.tool_calling.stream import Call, CallStart, Content, Step, ToolParser

PYTHON_TAG = "<|python_tag|>"
CALL_HEAD = [WS, "{", WS, '"name"', WS, ":", WS, STRING, WS, ",", WS, ('"parameters"', '"arguments"'), WS, ":", WS,
             "{"]
START, TEXT, CALL, ARGUMENTS, CALL_END, AFTER_CALL = "start", "text", "call", "arguments", "call end", "after call"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def scanner(self) -> Llama3JsonScanner:
        return Llama3JsonScanner()


class Llama3JsonScanner:
    def __init__(self):
        self._state = START
        self._opener = ""  # what led to the call being read (a tag, a separator): content if no call follows
        self._json: JsonEnd | None = None
        self._arguments: ArgumentsText | None = None

    def step(self, unread: str, final: bool) -> Step | None:
        return {START: self._start, TEXT: self._text, CALL: self._call, ARGUMENTS: self._streamed,
                CALL_END: self._call_end, AFTER_CALL: self._after_call}[self._state](unread, final)

    def _start(self, unread: str, final: bool) -> Step | None:
        """The output's opening: calls when it opens with an object or the tag, else content."""
        space = leading_space(unread)
        tag = starts_with(unread[space:], PYTHON_TAG, final)
        if tag is None or (space == len(unread) and not final):
            return None
        if tag:
            return self._to_call(space + len(PYTHON_TAG), unread[:space], PYTHON_TAG)
        self._state = CALL if unread[space:space + 1] == "{" else TEXT
        return space, [Content(unread[:space])] if space else []

    def _text(self, unread: str, final: bool) -> Step | None:
        read, text, found = text_before_marker(unread, PYTHON_TAG, final)
        if read == 0 and not found:
            return None
        if found:
            return self._to_call(read, text, PYTHON_TAG)
        return read, [Content(text)] if text else []

    def _to_call(self, read: int, content: str, opener: str) -> Step:
        self._state, self._opener = CALL, opener
        return read, [Content(content)] if content else []

    def _call(self, unread: str, final: bool) -> Step | None:
        """A call's object, settled where it ends; anything else is content."""
        start = leading_space(unread)
        if start == len(unread) and not final:
            return None
        if unread[start:start + 1] != "{":
            return self._content(start, self._opener + unread[:start])
        if self._json is None:
            head = match_head(unread, CALL_HEAD, final)
            if head == MORE:
                return None
            if head != NO:
                self._state, self._opener, self._arguments = ARGUMENTS, "", ArgumentsText(0)
                return head.arguments_at, [CallStart(head.name)]
            self._json = JsonEnd(start)
        end = self._json.find(unread)
        if end is None:
            return self._content(len(unread), self._opener + unread) if final else None
        call = parse_call(unread[start:end])
        self._json = None
        if call is None:
            return self._content(end, self._opener + unread[:end])
        self._state, self._opener = AFTER_CALL, ""
        return end, [call]

    def _streamed(self, unread: str, final: bool) -> Step | None:
        """A streamed call's arguments, handed out as they arrive, up to the object's end (or the output's)."""
        step, over = self._arguments.scan(unread, final)
        if over:
            self._state, self._arguments = CALL_END, None
        return step

    def _call_end(self, unread: str, final: bool) -> Step | None:
        """After a streamed call's arguments: the call object's "}" (then maybe ";" and another call), or
        content."""
        start = leading_space(unread)
        if start == len(unread) and not final:
            return None
        if unread[start:start + 1] == "}":
            self._state = AFTER_CALL
            return start + 1, []
        self._state = TEXT
        return 0, []

    def _content(self, read: int, text: str) -> Step:
        self._state, self._opener, self._json = TEXT, "", None
        return read, [Content(text)] if text else []

    def _after_call(self, unread: str, final: bool) -> Step | None:
        """After a call: ";" and another call, or content."""
        start = leading_space(unread)
        if start == len(unread):
            return (start, [Content(unread)]) if start else None
        if unread[start] != ";":
            self._state = TEXT
            return start, [Content(unread[:start])] if start else []
        after = start + 1 + leading_space(unread[start + 1:])
        if after == len(unread) and not final:
            return None
        if unread[after:after + 1] == "{":
            return self._to_call(after, unread[:start], unread[start:after])
        self._state = TEXT
        return start, [Content(unread[:start])] if start else []


def parse_call(text: str) -> Call | None:
    """The call a JSON object holds, or None when it is no well-formed call."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    if ("parameters" in value) == ("arguments" in value):
        return None
    arguments = arguments_text(value["parameters"] if "parameters" in value else value["arguments"])
    return None if arguments is None else Call(value["name"], arguments)
