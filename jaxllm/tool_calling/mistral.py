"""mistral: Mistral models' [TOOL_CALLS] (vLLM's `mistral`), in each form its tokenizer versions use:

    [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "neg", "arguments": {"a": 3}}]
                                                            before v11: one JSON array of calls
    [TOOL_CALLS]add{"a": 1, "b": 2}[TOOL_CALLS]neg{"a": 3}   v11: a name, then the arguments object
    [TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]neg[ARGS]{"a": 3}
                                                            v13: [ARGS] between them

The named forms stream: once the name and the arguments' "{" are read it is a call, and its arguments are the
object's text as written. Text before and between is content. A [TOOL_CALLS] that no well-formed call follows is content, from the marker to
where the text stops being a call. [TOOL_CALLS] and [ARGS] are special tokens: the output must be detokenized with
them (skip_special_tokens=False). Call ids are 9 letters and digits: Mistral's chat templates refuse any other id
when the call comes back in the conversation.
"""

from __future__ import annotations

import json
import re

from jaxllm.tool_calling.brackets import JsonEnd
from jaxllm.tool_calling.call_head import ArgumentsText
from jaxllm.tool_calling.calls import arguments_text, random_alphanumeric
from jaxllm.tool_calling.markers import leading_space, starts_with, text_before_marker
from jaxllm.tool_calling.stream import Call, CallStart, Content, Step, ToolParser

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.-]*")


class MistralToolParser(ToolParser):
    name = "mistral"

    def scanner(self) -> MistralScanner:
        return MistralScanner()

    def new_call_id(self) -> str:
        return random_alphanumeric(9)


class MistralScanner:
    def __init__(self):
        self._in_call = False
        self._json: JsonEnd | None = None  # inside a call: the end of its JSON value, searched as text arrives
        self._arguments: ArgumentsText | None = None  # a named call's arguments, streamed

    def step(self, unread: str, final: bool) -> Step | None:
        if self._arguments is not None:
            return self._streamed(unread, final)
        if self._in_call:
            return self._call(unread, final)
        read, text, found = text_before_marker(unread, MARKER, final)
        self._in_call = found
        if read == 0 and not found:
            return None
        return read, [Content(text)] if text else []

    def _call(self, unread: str, final: bool) -> Step | None:
        """What follows a marker: an array of calls or one named call, settled where its JSON value ends (or
        content, up to where it stops being a call)."""
        start = leading_space(unread)
        if start == len(unread):
            return self._not_a_call(unread, len(unread)) if final else None
        if unread[start] == "[":
            return self._json_value(unread, start, final, parse_array)
        name_end = _NAME.match(unread, start).end()
        if name_end == len(unread) and not final:
            return None
        args = starts_with(unread[name_end:], ARGS, final)
        if args is None:
            return None
        value_start = name_end + len(ARGS) if args else name_end
        if not unread[value_start:value_start + 1]:
            return self._not_a_call(unread, len(unread)) if final else None
        if name_end == start or unread[value_start] != "{":
            return self._not_a_call(unread, value_start)
        self._in_call, self._arguments = False, ArgumentsText(0)
        return value_start, [CallStart(unread[start:name_end])]

    def _streamed(self, unread: str, final: bool) -> Step | None:
        """A named call's arguments, handed out as they arrive, up to the object's end (or the output's)."""
        step, over = self._arguments.scan(unread, final)
        if over:
            self._arguments = None
        return step

    def _json_value(self, unread: str, start: int, final: bool, parse) -> Step | None:
        if self._json is None:
            self._json = JsonEnd(start)
        end = self._json.find(unread)
        if end is None:
            return self._not_a_call(unread, len(unread)) if final else None
        calls = parse(unread[start:end])
        return self._settled(end, calls) if calls else self._not_a_call(unread, end)

    def _not_a_call(self, unread: str, end: int) -> Step:
        return self._settled(end, [Content(MARKER + unread[:end])])

    def _settled(self, read: int, events: list) -> Step:
        self._in_call, self._json = False, None
        return read, events


def parse_array(text: str) -> list[Call] | None:
    """The calls of a JSON array [{"name": ..., "arguments": {...}}, ...], or None unless all are well formed."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting too deep for the decoder
        return None
    if not isinstance(value, list) or not value:
        return None
    calls = [parse_item(item) for item in value]
    return None if None in calls else calls


def parse_item(item) -> Call | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None
    arguments = arguments_text(item.get("arguments", {}))
    return None if arguments is None else Call(item["name"], arguments)


