"""The pieces a stream hands out (OpenAI's streaming shapes), and their reassembly.

    ContentDelta(text)                              delta {"content": text}
    ReasoningDelta(text)                            delta {"reasoning_content": text}
    ToolCallDelta(index, arguments, id, name)       delta {"tool_calls": [item]}: a call's first delta carries its
                                                    index, id, type and name (arguments ""), the next ones the
                                                    same index and pieces of the arguments text

Reassembled (content concatenated, each call's argument pieces concatenated), a stream's deltas give what the
parser's extract() gives for the whole text.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxllm.tool_calling.calls import ExtractedToolCalls, ToolCall


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    arguments: str
    id: str | None = None  # set in a call's first delta only, with name
    name: str | None = None

    def to_openai(self) -> dict:
        """The delta's `tool_calls` item."""
        function = {"arguments": self.arguments} if self.name is None else {"name": self.name,
                                                                           "arguments": self.arguments}
        item: dict = {"index": self.index}
        if self.id is not None:
            item.update(id=self.id, type="function")
        item["function"] = function
        return item


def assemble_tool_deltas(deltas: list[ContentDelta | ToolCallDelta]) -> ExtractedToolCalls:
    """The content and calls that a tool-call stream's deltas add up to."""
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    heads: dict[int, ToolCallDelta] = {}
    arguments: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, ToolCallDelta):
            if d.id is not None:
                heads[d.index] = d
            arguments.setdefault(d.index, []).append(d.arguments)
    calls = [ToolCall(id=heads[i].id, name=heads[i].name, arguments="".join(arguments[i])) for i in sorted(heads)]
    return ExtractedToolCalls(content or None, calls)
