"""How the server reads a chat reply's text: reasoning apart (--reasoning-parser), then tool calls (tool_choice
"auto" through --tool-call-parser; "required" and a named function: the JSON their structured output produced).

    ReplyReader.stream()       -> ReplyStream: feed(delta_text) / finish() -> deltas (ContentDelta,
                                  ReasoningDelta, ToolCallDelta), in OpenAI's streaming order
    ReplyReader.whole(text)    -> Reply(reasoning_content, content, tool_calls): the stream's deltas reassembled,
                                  so a streamed reply always adds up to the non-streamed one

A call's deltas come as it is generated: its index, id and name first, then its arguments in pieces (a forced
call's too: its JSON is read as it arrives). A reply cut by max_tokens keeps the calls begun before the cut.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jaxllm.tool_calling import (ContentDelta, NamedToolParser, ReasoningDelta, ReasoningParser, RequiredToolParser,
                                 ToolCall, ToolCallDelta, ToolParser, assemble_tool_deltas)


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
        stream = self.stream()
        deltas = stream.feed(text) + stream.finish()
        reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) or None
        extracted = assemble_tool_deltas([d for d in deltas if not isinstance(d, ReasoningDelta)])
        if self.calls_parser() is None:  # plain text: the content as it is ("" included)
            return Reply(reasoning, "".join(d.text for d in deltas if isinstance(d, ContentDelta)), [])
        return Reply(reasoning, extracted.content, extracted.tool_calls)

    def stream(self) -> "ReplyStream":
        return ReplyStream(self)

    def calls_parser(self) -> ToolParser | None:
        """What reads the calls out of the answer (None: there are none to read)."""
        if self.forced is None:
            return self.tool_parser
        return NamedToolParser(self.forced) if self.named else RequiredToolParser()

    def finish_reason(self, reason: str | None, num_calls: int) -> str | None:
        """OpenAI's: "tool_calls" where a reply that stopped by itself made calls (a named function: "stop")."""
        return "tool_calls" if num_calls and reason == "stop" and not self.named else reason


class ReplyStream:
    def __init__(self, reader: ReplyReader):
        self.reader = reader
        self._reasoning = None if reader.reasoning is None else reader.reasoning.stream(
            enable_thinking=reader.enable_thinking)
        parser = reader.calls_parser()
        self._calls = None if parser is None else parser.stream()
        self.num_tool_calls = 0

    def feed(self, text: str) -> list:
        return self._route(self._reasoning.feed(text) if self._reasoning else [ContentDelta(text)], final=False)

    def finish(self) -> list:
        return self._route(self._reasoning.finish() if self._reasoning else [], final=True)

    def _route(self, deltas: list, final: bool) -> list:
        routed = []
        for delta in deltas:
            if isinstance(delta, ContentDelta) and self._calls is not None:
                routed += self._calls.feed(delta.text)
            else:
                routed.append(delta)
        if final and self._calls is not None:
            routed += self._calls.finish()
        self.num_tool_calls += sum(1 for d in routed if isinstance(d, ToolCallDelta) and d.name)
        return routed
