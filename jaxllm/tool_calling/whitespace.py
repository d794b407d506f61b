"""HeldWhitespace: text that arrives in pieces, with the whitespace at its edges removed as it streams.

An edge is a tool call (or the end of the reasoning): the whitespace just before it and just after it is dropped
("Let me check.\n\n<tool_call>..." has the content "Let me check."). Trailing whitespace is held back until text
follows it (then it is kept) or an edge does (then it is dropped); leading whitespace after an edge is dropped.
"""

from __future__ import annotations


class HeldWhitespace:
    def __init__(self, *, at_edge: bool):
        self._held = ""
        self._at_edge = at_edge  # the text read so far ends at an edge (leading whitespace is dropped)

    def push(self, text: str) -> str:
        """The part of `text` that can be handed out now."""
        if self._at_edge:
            text = text.lstrip()
            if not text:
                return ""
            self._at_edge = False
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body):]
        return body

    def edge(self) -> None:
        """An edge: the held whitespace is dropped, and the whitespace that follows will be."""
        self._held = ""
        self._at_edge = True

    def flush(self) -> str:
        """The end of the text: the held whitespace, kept."""
        held, self._held = self._held, ""
        return held
