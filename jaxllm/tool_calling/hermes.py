"""hermes: Hermes 2 Pro, Qwen2.5, Qwen3 and others (vLLM's `hermes`).

    Let me check both.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}
    </tool_call>

A call is a JSON object {"name": string, "arguments": object} between <tool_call> and </tool_call>. Written in
that order (as Qwen and Hermes 3 write it), the call streams: once `<tool_call>{"name": "get_weather",
"arguments": {` is read it is a call, and its arguments are the object's text as written (up to its closing
bracket; what follows up to </tool_call> other than "}" and whitespace is content). Otherwise the call is read
whole at its closing tag: the arguments may then also come first, as the JSON text of an object, or be left out
({}). The last call may lack its closing tag: the output stopped there. Text outside the tags is content; tags
whose body is no call are content too, tags and all.
"""

from __future__ import annotations

import json

from jaxllm.tool_calling.call_head import MORE, NO, STRING, WS, ArgumentsText, match_head
from jaxllm.tool_calling.calls import arguments_text
from jaxllm.tool_calling.markers import text_before_marker
from jaxllm.tool_calling.stream import Call, CallStart, Content, Step, ToolParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_HEAD = [WS, "{", WS, '"name"', WS, ":", WS, STRING, WS, ",", WS, '"arguments"', WS, ":", WS, "{"]
TEXT, HEAD, ARGUMENTS, TAIL, WHOLE = "text", "head", "arguments", "tail", "whole"


class HermesToolParser(ToolParser):
    name = "hermes"

    def scanner(self) -> HermesScanner:
        return HermesScanner()


class HermesScanner:
    def __init__(self):
        self._state = TEXT
        self._searched = 0  # inside a call: where the search for its closing tag goes on
        self._arguments: ArgumentsText | None = None

    def step(self, unread: str, final: bool) -> Step | None:
        return {TEXT: self._text, HEAD: self._head, ARGUMENTS: self._streamed, TAIL: self._tail,
                WHOLE: self._call}[self._state](unread, final)

    def _text(self, unread: str, final: bool) -> Step | None:
        read, text, found = text_before_marker(unread, OPEN, final)
        if found:
            self._state = HEAD
        if read == 0 and not found:
            return None
        return read, [Content(text)] if text else []

    def _head(self, unread: str, final: bool) -> Step | None:
        """After <tool_call>: a head in the streamed form starts a call; any other body is read whole."""
        head = match_head(unread, CALL_HEAD, final)
        if head == MORE:
            return None
        if head == NO:
            self._state = WHOLE
            return 0, []
        self._state, self._arguments = ARGUMENTS, ArgumentsText(0)
        return head.arguments_at, [CallStart(head.name)]

    def _streamed(self, unread: str, final: bool) -> Step | None:
        """The arguments, handed out as they arrive, up to the object's end (or the output's)."""
        step, over = self._arguments.scan(unread, final)
        if over:
            self._state, self._arguments = TAIL, None
        return step

    def _tail(self, unread: str, final: bool) -> Step | None:
        """From the arguments' end to </tool_call> (or the output's end): the call object's "}" and whitespace
        dropped, anything else content."""
        closed = self._up_to_close(unread, final)
        if closed is None:
            return None
        body, read = closed
        rest = body.strip()
        rest = rest[1:].strip() if rest.startswith("}") else rest
        return read, [Content(rest)] if rest else []

    def _call(self, unread: str, final: bool) -> Step | None:
        """The call whose opening tag was read: settled at its closing tag, or at the end of the output."""
        closed = self._up_to_close(unread, final)
        if closed is None:
            return None
        body, read = closed
        call = parse_call(body)
        return read, [call or Content(OPEN + unread[:read])]

    def _up_to_close(self, unread: str, final: bool) -> tuple[str, int] | None:
        """(the text before </tool_call>, the characters read through it) once the tag (or the output's end) is
        read, the scanner back to TEXT; None while the tag may still come (the search resumes where it stopped)."""
        close = unread.find(CLOSE, self._searched)
        if close < 0 and not final:
            self._searched = max(0, len(unread) - len(CLOSE) + 1)
            return None
        self._state, self._searched = TEXT, 0
        return (unread, len(unread)) if close < 0 else (unread[:close], close + len(CLOSE))


def parse_call(body: str) -> Call | None:
    """The call a tag pair holds, or None when it holds no well-formed call."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = arguments_text(value.get("arguments", {}))
    return None if arguments is None else Call(value["name"], arguments)
