"""A call's head read as it arrives, and its arguments object handed out in pieces as they arrive.

A call streams in two parts (OpenAI's deltas): its head (the name) as soon as it is known, then the arguments
object's text, piece by piece, as the model writes it. The head is a short pattern, matched by match_head():

    HERMES_HEAD = [WS, "{", WS, '"name"', WS, ":", WS, STRING, WS, ",", WS, '"arguments"', WS, ":", WS, "{"]

    match_head(text, pattern, final) -> Head(name, arguments_at) | MORE | NO

The name is a JSON string (STRING) or a Python identifier (IDENTIFIER: pythonic's calls, `[get_weather(`). WS is
whitespace; PY_SPACE what Python reads as nothing inside brackets: whitespace, `#` comments to the end of their
line and backslash-newlines (python_space).
MORE: the text is a proper beginning of the pattern (more text may complete it); NO: it is not (the caller reads
the call whole instead, or as content). The answer depends on the text only, never on how it was split. Once a
head matched, the call is a call: its arguments are the text of the object that opens at `arguments_at`, up to
its closing bracket (ArgumentsText), as the model wrote it (pythonic's Python arguments are converted to JSON
instead, one keyword argument at a time: pythonic.py).
"""

from __future__ import annotations

import json
import keyword
import re
import unicodedata
from typing import NamedTuple

from jaxllm.tool_calling.brackets import JsonEnd
from jaxllm.tool_calling.stream import CallArguments, Step

WS, STRING, IDENTIFIER = "<whitespace>", "<string>", "<identifier>"  # pattern parts; any other part is literal
PY_SPACE = "<python space>"
MORE, NO = "more", "no"                                                # text, or a tuple of choices
_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*', re.DOTALL)
_WORD = re.compile(r"\w*")


class Head(NamedTuple):
    name: str
    arguments_at: int  # where the arguments object's "{" is


def match_head(text: str, pattern: list, final: bool) -> Head | str:
    """Whether `text` opens with `pattern` (its last part the arguments' opening); the pattern's one STRING or
    IDENTIFIER is the name."""
    pos, name = 0, None
    for part in pattern:
        if pos == len(text):
            return NO if final else MORE
        if part == WS:
            pos += len(text) - pos - len(text[pos:].lstrip())
            continue
        if part == PY_SPACE:
            pos = python_space(text, pos, final)
            if pos == MORE:
                return MORE
            continue
        if part in (STRING, IDENTIFIER):
            end = (_string_end if part == STRING else _identifier_end)(text, pos, final)
            if end in (MORE, NO):
                return NO if final else end
            name, pos = end
            continue
        found = _literal(text, pos, part if isinstance(part, tuple) else (part,), final)
        if found in (MORE, NO):
            return found
        pos += found
    if not name:
        return NO
    return Head(name, pos - 1)


def python_space(text: str, pos: int, final: bool) -> int | str:
    """Where the whitespace, comments and backslash-newlines from text[pos] end (Python reads them as nothing
    inside brackets); MORE when the text ends in a comment or right after a backslash and is not final (a comment
    in a final text runs to its end)."""
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
        elif text[pos] == "#":
            newline = text.find("\n", pos)
            if newline < 0:
                return len(text) if final else MORE
            pos = newline + 1
        elif text[pos] == "\\" and text.startswith("\n", pos + 1):
            pos += 2
        elif text[pos] == "\\" and pos + 1 == len(text) and not final:
            return MORE
        else:
            break
    return pos


def _literal(text: str, pos: int, choices: tuple[str, ...], final: bool) -> int | str:
    rest = text[pos:]
    for choice in choices:
        if rest.startswith(choice):
            return len(choice)
    if not final and any(choice.startswith(rest) for choice in choices):
        return MORE
    return NO


def _identifier_end(text: str, pos: int, final: bool) -> tuple[str, int] | str:
    """(the Python identifier, as Python reads it: NFKC-normalized, the index past it) opening at text[pos]."""
    end = _WORD.match(text, pos).end()
    if end == len(text) and not final:
        return MORE  # the name may go on
    name = text[pos:end]
    if not name.isidentifier() or keyword.iskeyword(name):
        return NO
    return unicodedata.normalize("NFKC", name), end


def _string_end(text: str, pos: int, final: bool) -> tuple[str, int] | str:
    """(the JSON string's value, the index past it) for the string opening at text[pos]."""
    if text[pos] != '"':
        return NO
    body = _STRING_BODY.match(text, pos + 1).end()
    if body == len(text) or text[body] == "\\":
        return MORE  # the closing quote (or the character a final backslash escapes) has not arrived
    try:
        value = json.loads(text[pos:body + 1])
    except ValueError:
        return NO
    return value, body + 1


class ArgumentsText:
    """The arguments object opening at unread[start], handed out as it arrives: step() gives the piece that came
    since the last step, and where the object ends (None while it goes on). The unread text must keep its start
    until the object ends (the caller reads nothing of it before)."""

    def __init__(self, start: int):
        self._end = JsonEnd(start)
        self._sent = start

    def step(self, unread: str) -> tuple[str, int | None]:
        end = self._end.find(unread)
        stop = len(unread) if end is None else end
        piece, self._sent = unread[self._sent:stop], stop
        return piece, end

    def scan(self, unread: str, final: bool) -> tuple[Step | None, bool]:
        """A scanner's step over the arguments (the new piece as a CallArguments event), and whether they are
        over: the object closed, or the output ended."""
        piece, end = self.step(unread)
        if end is None and not final:
            return ((0, [CallArguments(piece)]) if piece else None), False
        return ((len(unread) if end is None else end), [CallArguments(piece)]), True
