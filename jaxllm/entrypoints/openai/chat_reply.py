"""How the server reads a chat reply's text: reasoning apart (--reasoning-parser), then tool calls (tool_choice
"auto" through --tool-call-parser; "required" and a named function: the JSON their structured output produced).

    ReplyReader.whole(text)    -> Reply(reasoning_content, content, tool_calls)
    ReplyReader.stream()       -> ReplyStream: feed(delta_text) / finish() -> deltas (ContentDelta,
                                  ReasoningDelta, ToolCallDelta), in OpenAI's streaming order

A forced call (required, named) is read when the reply is whole: its deltas come with finish().
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jaxllm.tool_calling import (ContentDelta, ReasoningDelta, ReasoningParser, ToolCall, ToolCallDelta, ToolParser,
                                 calls_from_named_output, calls_from_required_output)


class Reply(NamedTuple):
    reasoning_content: str | None
    content: str | None
    tool_calls: list[ToolCall]


@dataclasses.dataclass(frozen=True)
class ReplyReader:
    reasoning: ReasoningParser | None = None
    enable_thinking: bool = True
    tool_parser: ToolParser | None = None  # tool_choice "auto"
    forced: str | None = None  # tool_choice "required", or the named function
    named: bool = False  # forced names a function

    def whole(self, text: str) -> Reply:
        deltas = self._split(text)
        reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) or None
        content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
        if self.forced is not None:
            return Reply(reasoning, None, self._forced_calls(content))
        if self.tool_parser is not None:
            extracted = self.tool_parser.extract(content)
            return Reply(reasoning, extracted.content, extracted.tool_calls)
        return Reply(reasoning, content, [])

    def stream(self) -> "ReplyStream":
        return ReplyStream(self)

    def finish_reason(self, reason: str | None, num_calls: int) -> str | None:
        """OpenAI's: "tool_calls" where a reply that stopped by itself made calls (a named function: "stop")."""
        return "tool_calls" if num_calls and reason == "stop" and not self.named else reason

    def _split(self, text: str) -> list:
        if self.reasoning is None:
            return [ContentDelta(text)]
        stream = self.reasoning.stream(enable_thinking=self.enable_thinking)
        return stream.feed(text) + stream.finish()

    def _forced_calls(self, text: str) -> list[ToolCall]:
        try:
            return calls_from_named_output(self.forced, text) if self.named else calls_from_required_output(text)
        except ValueError:
            return []  # cut by max_tokens: no whole call (finish_reason "length" says why)


class ReplyStream:
    def __init__(self, reader: ReplyReader):
        self.reader = reader
        self._reasoning = None if reader.reasoning is None else reader.reasoning.stream(
            enable_thinking=reader.enable_thinking)
        self._tools = None if reader.tool_parser is None or reader.forced else reader.tool_parser.stream()
        self._forced_text: list[str] = []
        self.num_tool_calls = 0

    def feed(self, text: str) -> list:
        return self._route(self._reasoning.feed(text) if self._reasoning else [ContentDelta(text)], final=False)

    def finish(self) -> list:
        return self._route(self._reasoning.finish() if self._reasoning else [], final=True)

    def _route(self, deltas: list, final: bool) -> list:
        routed = []
        for delta in deltas:
            if isinstance(delta, ContentDelta) and self._tools is not None:
                routed += self._tools.feed(delta.text)
            elif isinstance(delta, ContentDelta) and self.reader.forced is not None:
                self._forced_text.append(delta.text)
            else:
                routed.append(delta)
        if final and self._tools is not None:
            routed += self._tools.finish()
        if final and self.reader.forced is not None:
            calls = self.reader._forced_calls("".join(self._forced_text))
            for index, call in enumerate(calls):
                routed += [ToolCallDelta(index, "", id=call.id, name=call.name), ToolCallDelta(index, call.arguments)]
        self.num_tool_calls += sum(1 for d in routed if isinstance(d, ToolCallDelta) and d.name)
        return routed
