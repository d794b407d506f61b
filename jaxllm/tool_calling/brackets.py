"""Where a bracketed value that opens a text ends, found while the text grows (each call reads only what arrived
since the last one).

    JsonEnd      a JSON object or array: brackets counted outside strings (escapes skipped)
    PythonEnd    a Python list or call: brackets counted outside '...', "...", '''...''', \"\"\"...\"\"\" and # comments
    PythonItemEnd  an item of a Python call's arguments: up to the "," or ")" after it, counted the same way

The first point where the count returns to zero is the value's end when the value is well formed; whether it is,
json.loads or ast.parse then says. The answer depends only on the text, never on how it arrived.
"""

from __future__ import annotations

import re

_OPEN = "{[("
_JSON_OUTSIDE = re.compile(r'["{}\[\]]')
_JSON_INSIDE = re.compile(r'["\\]')
_PYTHON_OUTSIDE = re.compile(r"""['"{}\[\]()#]""")
_PYTHON_ITEM_OUTSIDE = re.compile(r"""['"{}\[\](),#]""")
_STRING_STOP = {"'": re.compile(r"[\\']"), '"': re.compile(r'[\\"]')}
_MORE = -1  # the text ends too soon to go on


class JsonEnd:
    """The end of the JSON object or array opening at text[start]."""

    def __init__(self, start: int = 0):
        self._pos, self._depth, self._in_string = start, 0, False

    def find(self, text: str) -> int | None:
        """The index just past the closing bracket, or None while it has not arrived."""
        while True:
            match = (_JSON_INSIDE if self._in_string else _JSON_OUTSIDE).search(text, self._pos)
            if match is None:
                self._pos = len(text)
                return None
            char, at = match.group(), match.start()
            if char == "\\":
                if at + 1 >= len(text):  # the escaped character has not arrived
                    self._pos = at
                    return None
                self._pos = at + 2
                continue
            self._pos = at + 1
            if char == '"':
                self._in_string = not self._in_string
            elif char in _OPEN:
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return at + 1


class PythonEnd:
    """The end of the Python bracketed expression opening at text[start]."""

    _outside = _PYTHON_OUTSIDE  # what the search outside strings stops at

    def __init__(self, start: int = 0):
        self._pos, self._depth = start, 0
        self._quote = ""  # the open string's delimiter: ', ", ''' or \"\"\" ("": none)
        self._in_comment = False

    def find(self, text: str, final: bool) -> int | None:
        """The index just past the closing bracket, or None while it has not arrived (when `final`: it never
        will)."""
        while self._pos < len(text):
            if self._in_comment:
                found = self._comment_step(text)
            else:
                found = self._string_step(text, final) if self._quote else self._bracket_step(text, final)
            if found == _MORE:
                return None
            if found is not None:
                return found
        return None

    def _bracket_step(self, text: str, final: bool) -> int | None:
        """Reads up to the next bracket, quote or comment: the end when it closes the expression, _MORE when the
        text ends too soon to read a quote, None otherwise."""
        match = self._outside.search(text, self._pos)
        if match is None:
            self._pos = len(text)
            return None
        char, at = match.group(), match.start()
        if char == "#":  # a comment: brackets and quotes in it are text, up to the end of its line
            self._pos, self._in_comment = at + 1, True
            return None
        if char in "'\"":
            triple = starts_triple(text, at, char, final)
            if triple is None:
                self._pos = at
                return _MORE
            self._quote = char * 3 if triple else char
            self._pos = at + len(self._quote)
            return None
        self._pos = at + 1
        if char == ",":  # searched for by PythonItemEnd only
            return at + 1 if self._depth == 1 else None
        self._depth += 1 if char in _OPEN else -1
        return at + 1 if self._depth == 0 else None

    def _comment_step(self, text: str) -> None:
        """Reads the open comment up to the end of its line."""
        newline = text.find("\n", self._pos)
        self._pos, self._in_comment = (len(text), True) if newline < 0 else (newline + 1, False)
        return None

    def _string_step(self, text: str, final: bool) -> int | None:
        """Reads the open string up to its closing quote: _MORE when the text ends too soon to say whether it
        closes, None otherwise."""
        quote, at = self._quote, self._pos
        while (match := _STRING_STOP[quote[0]].search(text, at)) is not None:
            at = match.start()
            if text[at] == "\\":
                if at + 1 >= len(text) and not final:
                    self._pos = at
                    return _MORE
                at += 2
            elif text.startswith(quote, at):
                self._pos, self._quote = at + len(quote), ""
                return None
            elif len(quote) == 3 and not final and quote.startswith(text[at:]):
                self._pos = at  # '' at the end of the text may be the start of the closing '''
                return _MORE
            else:
                at += 1
        self._pos = len(text)
        return None


class PythonItemEnd(PythonEnd):
    """The end of the item opening at text[start] inside a Python call's parentheses (a keyword argument, say):
    the index just past the first "," or closing bracket outside the item's own brackets and strings, the
    character that ends the item (for a well-formed item, "," or the call's ")"). The item's text is what lies
    between; whether it is well formed, ast says."""

    _outside = _PYTHON_ITEM_OUTSIDE

    def __init__(self, start: int = 0):
        super().__init__(start)
        self._depth = 1  # inside the call's parentheses


def starts_triple(text: str, at: int, quote: str, final: bool) -> bool | None:
    """Whether the string opening at text[at] is triple-quoted; None while the text ends too soon to say."""
    if text.startswith(quote * 3, at):
        return True
    if not final and (quote * 3).startswith(text[at:]):
        return None
    return False
