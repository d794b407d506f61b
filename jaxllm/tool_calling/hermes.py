"""hermes: Hermes 2 Pro, Qwen2.5, Qwen3 and others (vLLM's `hermes`).

    Let me check both.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}
    </tool_call>

A call is a JSON object {"name": string, "arguments": object} between <tool_call> and </tool_call> (the arguments
may also come as the JSON text of an object, or be left out: {}). The last call may lack its closing tag: the
output stopped there. Text outside the tags is content; tags whose body is no such object are content too, tags
and all.
"""

from __future__ import annotations

import json

from jaxllm.tool_calling.calls import arguments_text
from jaxllm.tool_calling.markers import text_before_marker
from jaxllm.tool_calling.stream import Call, Content, Step, ToolParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def scanner(self) -> HermesScanner:
        return HermesScanner()


class HermesScanner:
    def __init__(self):
        self._in_call = False
        self._searched = 0  # inside a call: where the search for its closing tag goes on

    def step(self, unread: str, final: bool) -> Step | None:
        if self._in_call:
            return self._call(unread, final)
        read, text, found = text_before_marker(unread, OPEN, final)
        self._in_call = found
        if read == 0 and not found:
            return None
        return read, [Content(text)] if text else []

    def _call(self, unread: str, final: bool) -> Step | None:
        """The call whose opening tag was read: settled at its closing tag, or at the end of the output."""
        close = unread.find(CLOSE, self._searched)
        if close < 0 and not final:
            self._searched = max(0, len(unread) - len(CLOSE) + 1)
            return None
        body, read = (unread, len(unread)) if close < 0 else (unread[:close], close + len(CLOSE))
        self._in_call, self._searched = False, 0
        call = parse_call(body)
        return read, [call or Content(OPEN + unread[:read])]


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
