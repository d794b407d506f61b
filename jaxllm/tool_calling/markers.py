"""Markers (<tool_call>, [TOOL_CALLS], <think>, ...) in text that arrives in pieces.

A stream must not hand out text that may still grow into a marker: "...<tool_" is held back until the next piece
says whether it was "<tool_call>". Once the output is final, nothing is held back.
"""

from __future__ import annotations


def partial_marker_length(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `marker` (0: none)."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def text_before_marker(text: str, marker: str, final: bool) -> tuple[int, str, bool]:
    """Reads plain text up to the first `marker`: (characters read, the text read, whether the marker was found:
    then it was read too). Without a marker, a tail that may grow into one stays unread unless `final`."""
    at = text.find(marker)
    if at >= 0:
        return at + len(marker), text[:at], True
    end = len(text) if final else len(text) - partial_marker_length(text, marker)
    return end, text[:end], False


def starts_with(text: str, marker: str, final: bool) -> bool | None:
    """Whether `text` opens with `marker`; None while it is a proper prefix of it and more text may follow."""
    if text.startswith(marker):
        return True
    if not final and marker.startswith(text):
        return None
    return False


def leading_space(text: str) -> int:
    """The number of whitespace characters `text` opens with."""
    return len(text) - len(text.lstrip())
