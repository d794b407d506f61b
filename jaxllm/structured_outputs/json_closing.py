"""JsonPrefix: the beginning of a JSON document written under a schema, and the shortest way to finish it.

    prefix = JsonPrefix(schema)  # tool_choice "required" over search(query) and get_weather(city)
    prefix.feed(b'[{"name": "search", "parameters": {"query": "cheap fl')  # bytes, in any number of pieces
    prefix.closing()  ->  b'"}}]'                                          # None: no way found
    prefix.closings()[1]  ->  b'"}}, {"name": "get_weather", "parameters": {"city": ""}}]'   # the longest

The prefix is what a grammar built from the schema has accepted so far (xgrammar's JSON-schema grammar), so it is
read, not validated: open objects and arrays on a stack, the key being written, a string, number or literal in
progress. closing() finishes the scalar in progress (a string closed, an enum value's rest, a number's missing
digit, a UTF-8 character's missing bytes), then writes what each open container still needs: its missing required
properties (in the schema's property order, as the grammar writes them) with their minimal values, its items up to
minItems, its closing bracket. Minimal values: a const or the first enum value, 0 (within the bounds), false, null,
"" (padded to minLength), [] (filled to minItems), {} with the required properties; written with xgrammar's
one-line separators (", " and ": ").

closings() adds the longest closing the writer's next few bytes may lead to: instead of what closing() writes
next, a writer may begin another item or member, a longer key or enum value, another alternative (the example:
another call, if the array may hold one). A caller that must end the document within a budget starts closing while
that still fits.

A pattern string is finished by the first characters found (depth first) that let it match whole, a format's
minimal value is a fixed example ("2000-01-01" for a date). What it does not know how to satisfy (a format string
begun, an unknown format, allOf, prefixItems, a required property the schema does not describe) gives None: the caller then leaves the output to the model. The closing is
a proposal: the caller checks it against the grammar before using it.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import string
from typing import Any

import regex

_WHITESPACE = b" \t\n\r"
_SEPARATORS = (", ", ": ")  # what xgrammar's one-line JSON writes (any_whitespace off), and allows with it on
_COMMA, _COLON = (separator.encode() for separator in _SEPARATORS)
_NUMBER_BYTES = frozenset(b"0123456789+-.eE")
_LITERALS = (b"true", b"false", b"null")
_STRING_STOP = re.compile(rb'["\\]')
_COMPLETE_NUMBER = re.compile(rb"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_ESCAPE_TAIL = re.compile(rb"(\\+)(u[0-9a-fA-F]{0,3})?$")
_MAX_DEPTH = 32  # $ref chains and nested minimal values
_PATTERN_CHARACTERS = string.ascii_letters + string.digits + " -_.,:/@+#"  # tried, in order, to finish a pattern
_PATTERN_SEARCH_STEPS = 400  # partial matches tried before a pattern string is given up
_FORMAT_EXAMPLES = {"date": "2000-01-01", "time": "00:00:00Z", "date-time": "2000-01-01T00:00:00Z",
                    "email": "a@example.com", "uuid": "00000000-0000-0000-0000-000000000000", "ipv4": "0.0.0.0",
                    "ipv6": "::", "hostname": "a", "uri": "http://a"}  # minimal values of string formats
_CONTAINER = object()  # the value of a closed object or array (only scalars are kept)


class _Frame:
    """An open object or array. expect: object "key_or_end" (after "{"), "key" (after ","), "colon", "value",
    "after" (after a value); array "value_or_end", "value", "after"."""

    __slots__ = ("kind", "schemas", "keys", "values", "count", "expect")

    def __init__(self, kind: str, schemas: list[dict]):
        self.kind, self.schemas = kind, schemas  # object: its alternatives (anyOf branches); array: [its schema]
        self.keys: list[str] = []  # object: the keys written, in order
        self.values: dict[str, Any] = {}  # object: the scalar values written (to tell anyOf branches apart)
        self.count = 0  # array: items begun
        self.expect = "key_or_end" if kind == "object" else "value_or_end"


class JsonPrefix:
    def __init__(self, schema: dict):
        self._root = schema
        self._frames: list[_Frame] = []
        self._scalar: bytearray | None = None  # the bytes of a scalar in progress (a string's opening quote too)
        self._scalar_kind = ""  # "key", "string", "number" or "literal"
        self._escape_pending = False  # a string's last byte fed was the backslash of an escape
        self._separator_open = False  # the last byte fed was a "," or ":" (its separator's space is still to come)
        self.done = False  # the root value is complete
        self.failed = False  # a byte this reader could not place (then there is no closing)

    def copy(self) -> "JsonPrefix":
        other = copy.copy(self)
        other._frames = [copy.copy(frame) for frame in self._frames]
        for frame in other._frames:
            frame.keys, frame.values = list(frame.keys), dict(frame.values)
        other._scalar = None if self._scalar is None else bytearray(self._scalar)
        return other

    # ------------------------------------------------------------------ reading
    def feed(self, data: bytes) -> None:
        i = 0
        while i < len(data) and not self.failed:
            if self._scalar is not None:
                i = self._feed_scalar(data, i)
            elif data[i] in _WHITESPACE:
                i += 1
            else:
                self._structural(data[i])
                i += 1
        if data:
            self._separator_open = data[-1:] in (b",", b":") and self._scalar is None

    def _feed_scalar(self, data: bytes, i: int) -> int:
        """Takes bytes of the scalar in progress from data[i:]; the index after them."""
        if self._scalar_kind in ("key", "string"):
            if self._escape_pending:
                self._scalar.append(data[i])
                self._escape_pending = False
                return i + 1
            stop = _STRING_STOP.search(data, i)
            if stop is None:
                self._scalar += data[i:]
                return len(data)
            j = stop.start()
            if data[j] == ord("\\"):
                self._scalar += data[i:j + 2]
                self._escape_pending = j + 1 == len(data)
                return min(j + 2, len(data))
            self._scalar += data[i:j + 1]
            self._end_scalar()
            return j + 1
        j = i
        allowed = _NUMBER_BYTES if self._scalar_kind == "number" else frozenset(b"abcdefghijklmnopqrstuvwxyz")
        while j < len(data) and data[j] in allowed:
            j += 1
        self._scalar += data[i:j]
        if j < len(data):
            self._end_scalar()  # the byte at j is not the scalar's: read it as structure
        return j

    def _structural(self, byte: int) -> None:
        top = self._frames[-1] if self._frames else None
        char = chr(byte)
        if top is not None and top.kind == "object" and top.expect in ("key_or_end", "key"):
            if char == '"':
                self._scalar, self._scalar_kind = bytearray(b'"'), "key"
            elif char == "}" and top.expect == "key_or_end":
                self._pop()
            else:
                self.failed = True
        elif char == ":" and top is not None and top.expect == "colon":
            top.expect = "value"
        elif char == "," and top is not None and top.expect == "after":
            top.expect = "key" if top.kind == "object" else "value"
        elif char == "}" and top is not None and top.kind == "object" and top.expect == "after":
            self._pop()
        elif char == "]" and top is not None and top.kind == "array" and top.expect in ("after", "value_or_end"):
            self._pop()
        elif self._expects_value(top):
            self._begin_value(char)
        else:
            self.failed = True

    def _expects_value(self, top: _Frame | None) -> bool:
        if top is None:
            return not self.done
        return top.expect in ("value", "value_or_end")

    def _begin_value(self, char: str) -> None:
        schema = self._value_schema()
        top = self._frames[-1] if self._frames else None
        if top is not None and top.kind == "array":
            top.count += 1
        if char == "{":
            self._frames.append(_Frame("object", _alternatives(self._root, schema, "object")))
        elif char == "[":
            resolved = _resolve(self._root, schema)
            self._frames.append(_Frame("array", [resolved if isinstance(resolved, dict) else {}]))
        elif char == '"':
            self._scalar, self._scalar_kind = bytearray(b'"'), "string"
        elif char == "-" or char.isdigit():
            self._scalar, self._scalar_kind = bytearray(char.encode()), "number"
        elif char in "tfn":
            self._scalar, self._scalar_kind = bytearray(char.encode()), "literal"
        else:
            self.failed = True

    def _end_scalar(self) -> None:
        raw, kind = bytes(self._scalar), self._scalar_kind
        self._scalar, self._scalar_kind = None, ""
        try:
            value = json.loads(raw)
        except ValueError:
            self.failed = True
            return
        top = self._frames[-1] if self._frames else None
        if kind == "key":
            top.keys.append(value)
            top.expect = "colon"
        else:
            self._value_done(value)

    def _pop(self) -> None:
        self._frames.pop()
        self._value_done(_CONTAINER)

    def _value_done(self, value: Any) -> None:
        if not self._frames:
            self.done = True
            return
        top = self._frames[-1]
        if top.kind == "object" and value is not _CONTAINER:
            top.values[top.keys[-1]] = value
        top.expect = "after"

    def _value_schema(self) -> Any:
        """The schema of the value that begins now (as an anyOf of the object's agreeing branches' schemas for
        the key, where it has several)."""
        if not self._frames:
            return self._root
        top = self._frames[-1]
        if top.kind == "array":
            return top.schemas[0].get("items", {})
        found = [branch["properties"][top.keys[-1]] for branch in self._branches(top)
                 if top.keys[-1] in branch.get("properties", {})]
        return found[0] if len(found) == 1 else {"anyOf": found} if found else {}

    def _branches(self, frame: _Frame) -> list[dict]:
        """The object's alternatives that agree with what it holds: every key written is one of its properties,
        in its order, and every scalar written is allowed by its const or enum."""
        return [branch for branch in frame.schemas if _agrees(self._root, branch, frame)]

    # ------------------------------------------------------------------ closing
    def closing(self, limit: int = 512) -> bytes | None:
        """The shortest bytes found that finish the document (b"" when it is complete); None when none is found
        within `limit` bytes."""
        return self._close(limit)

    def closings(self, reach: int = 8, limit: int = 512) -> tuple[bytes, bytes] | None:
        """(closing(), the longest closing the document may need after the writer's next few bytes), found in one
        pass: along the shortest closing, within `reach` bytes of it, the writer may instead begin something the
        closing skips (another item or member, a key other than the closing's, a longer alternative of an array's
        items), and finishing that takes its minimal value too. None when closing() is."""
        found: list[bytes] = []

        def other_ways(prefix: JsonPrefix, written: bytes) -> None:
            if len(written) > reach:
                return
            for opening in prefix._openings():
                other = prefix.copy()
                other.feed(opening)
                rest = other._close(limit)
                if rest is not None:
                    found.append(written + opening + rest)

        closing = self._close(limit, other_ways)
        return None if closing is None else (closing, max([closing] + found, key=len))

    def _close(self, limit: int, at_each_state=None) -> bytes | None:
        """closing(), calling at_each_state(prefix, bytes written so far) before each piece of it."""
        if self.failed:
            return None
        prefix, out = self.copy(), bytearray()
        if prefix._separator_open:
            out += b" "  # the separator's space
        for _ in range(4 * limit):
            if prefix.done and prefix._scalar is None:
                return bytes(out)
            if (prefix._scalar_kind == "number" and _COMPLETE_NUMBER.fullmatch(prefix._scalar)) or \
                    (prefix._scalar_kind == "literal" and bytes(prefix._scalar) in _LITERALS):
                prefix._end_scalar()
                continue
            if at_each_state is not None:
                at_each_state(prefix, bytes(out))
            piece = prefix._next_piece()
            if piece is None:
                return None
            prefix.feed(piece)
            out += piece
            if prefix.failed or len(out) > limit:
                return None
        return None

    def _openings(self) -> list[bytes]:
        """What the writer may begin here that a closing would not: a longer alternative of the value due, the
        rest of another key, another member or item."""
        top = self._frames[-1] if self._frames else None
        if self._scalar_kind == "string":
            return _string_finishes(self._root, bytes(self._scalar), self._value_schema())
        if self._scalar is not None and self._scalar_kind != "key":
            return []
        if self._scalar is None and self._expects_value(top):
            return self._alternative_values(self._value_schema())
        if top is None:
            return []
        if top.kind == "array":
            more = top.expect == "after" and top.count < top.schemas[0].get("maxItems", math.inf)
            return [_COMMA + item for item in self._alternative_values(top.schemas[0].get("items", {}))] if more \
                else []
        branches = self._branches(top)
        keys = [_key_bytes(key) + _COLON for key in _later_keys(branches[0], top.keys)] if branches else []
        if self._scalar is not None:  # a key begun
            raw = bytes(self._scalar)
            return [key[len(raw):] for key in keys if key.startswith(raw)]
        if top.expect == "after":
            return [_COMMA + key for key in keys]
        return keys if top.expect in ("key_or_end", "key") else []

    def _alternative_values(self, schema: Any) -> list[bytes]:
        values = [_minimal(self._root, alt) for alt in _alternatives(self._root, schema)]
        return [value for value in values if value is not None]

    def _next_piece(self) -> bytes | None:
        if self._scalar is not None:
            return self._finish_scalar()
        if not self._frames:
            return _minimal(self._root, self._root)
        top = self._frames[-1]
        if top.kind == "array":
            return self._array_piece(top)
        return self._object_piece(top)

    def _array_piece(self, top: _Frame) -> bytes | None:
        schema = top.schemas[0]
        if "prefixItems" in schema:
            return None
        if top.expect == "value" or top.count < schema.get("minItems", 0):
            item = _minimal(self._root, schema.get("items", {}))
            return None if item is None else (_COMMA if top.expect == "after" else b"") + item
        return b"]"

    def _object_piece(self, top: _Frame) -> bytes | None:
        if top.expect == "colon":
            return _COLON
        branches = self._branches(top)
        if not branches:
            return None
        branch = branches[0]
        properties = branch.get("properties", {})
        if top.expect == "value":
            return _minimal(self._root, properties.get(top.keys[-1], {}))
        later = _later_keys(branch, top.keys)
        missing = [key for key in later if key in set(branch.get("required", ()))]
        if any(key not in properties for key in branch.get("required", ())):
            return None  # a required property the schema does not describe
        if top.expect == "key":  # a comma was written: some key must follow
            keys = missing or later
            return _key_bytes(keys[0]) + _COLON if keys else None
        if missing:
            return (_COMMA if top.expect == "after" else b"") + _key_bytes(missing[0]) + _COLON
        return b"}"

    def _finish_scalar(self) -> bytes | None:
        raw, kind = bytes(self._scalar), self._scalar_kind
        if kind == "number":
            return b"0"  # after "-", ".", "e", "e+" (a complete number ends in closing())
        if kind == "literal":
            return next((word[len(raw):] for word in _LITERALS if word.startswith(raw)), None)
        if kind == "key":
            for branch in self._branches(self._frames[-1]):
                later = _later_keys(branch, self._frames[-1].keys)
                required = set(branch.get("required", ()))
                for key in sorted(later, key=lambda k: k not in required):
                    for encoded in _encodings(key):
                        if encoded.startswith(raw):
                            return encoded[len(raw):]
            return None
        return _finish_string(self._root, raw, self._value_schema())


# ---------------------------------------------------------------------- schemas
def _resolve(root: dict, schema: Any, depth: int = 0) -> Any:
    """schema with its $ref followed (a JSON pointer into root: "#/$defs/Name")."""
    while isinstance(schema, dict) and "$ref" in schema and depth < _MAX_DEPTH:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        target: Any = root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                return None
            target = target[part]
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **rest} if isinstance(target, dict) else target
        depth += 1
    return schema


def _alternatives(root: dict, schema: Any, kind: str | None = None, depth: int = 0) -> list[dict]:
    """The schema's alternatives as plain schemas: anyOf / oneOf branches (each with the keywords beside them),
    $refs followed, a list of types split into one type each; of `kind` only when given."""
    schema = _resolve(root, schema)
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return []
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
            found = []
            for branch in schema[keyword]:
                branch = _resolve(root, branch)
                if isinstance(branch, dict):
                    found += _alternatives(root, {**rest, **branch}, kind, depth + 1)
            return found
    types = schema.get("type")
    if isinstance(types, list):
        return [alt for t in types for alt in _alternatives(root, {**schema, "type": t}, kind, depth + 1)]
    if kind is not None and _kind_of(schema) not in (kind, None):
        return []
    return [schema]


def _kind_of(schema: dict) -> str | None:
    if "type" in schema:
        return {"integer": "number"}.get(schema["type"], schema["type"])
    for keyword in ("const", "enum"):
        if keyword in schema:
            values = [schema["const"]] if keyword == "const" else schema["enum"]
            return _json_kind(values[0]) if values else None
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _agrees(root: dict, branch: dict, frame: _Frame) -> bool:
    properties = branch.get("properties", {})
    order = list(properties)
    positions = [order.index(key) if key in properties else -1 for key in frame.keys]
    if -1 in positions or positions != sorted(set(positions)):
        return False
    for key, value in frame.values.items():
        allowed = _resolve(root, properties[key])
        if isinstance(allowed, dict):
            if "const" in allowed and allowed["const"] != value:
                return False
            if "enum" in allowed and value not in allowed["enum"]:
                return False
    return True


def _later_keys(branch: dict, written: list[str]) -> list[str]:
    """The properties that may still follow the keys written (the grammar writes them in the schema's order)."""
    order = list(branch.get("properties", {}))
    start = order.index(written[-1]) + 1 if written else 0
    return order[start:]


def _key_bytes(key: str) -> bytes:
    return json.dumps(key, ensure_ascii=False).encode()


def _encodings(value: Any) -> list[bytes]:
    """value as one line of JSON, with non-ASCII characters as they are and as \\u escapes."""
    plain = json.dumps(value, ensure_ascii=False, separators=_SEPARATORS).encode()
    escaped = json.dumps(value, separators=_SEPARATORS).encode()
    return [plain] if plain == escaped else [plain, escaped]


def _minimal(root: dict, schema: Any, depth: int = 0) -> bytes | None:
    """The shortest value found that the schema allows, as one line of JSON; None when not found."""
    if depth > _MAX_DEPTH:
        return None
    for alt in _alternatives(root, schema):
        value = _minimal_of(root, alt, depth)
        if value is not None:
            return value
    return None


def _minimal_of(root: dict, schema: dict, depth: int) -> bytes | None:
    if "allOf" in schema or "not" in schema:
        return None
    if "const" in schema:
        return _encodings(schema["const"])[0]
    if "enum" in schema:
        return _encodings(schema["enum"][0])[0] if schema["enum"] else None
    kind = _kind_of(schema) or "null"
    if kind == "object":
        properties, required = schema.get("properties", {}), schema.get("required", [])
        if any(key not in properties for key in required):
            return None
        parts = []
        for key in properties:
            if key in required:
                value = _minimal(root, properties[key], depth + 1)
                if value is None:
                    return None
                parts.append(_key_bytes(key) + _COLON + value)
        return b"{" + _COMMA.join(parts) + b"}"
    if kind == "array":
        count = schema.get("minItems", 0)
        if not count:
            return b"[]"
        item = None if "prefixItems" in schema else _minimal(root, schema.get("items", {}), depth + 1)
        return None if item is None else b"[" + _COMMA.join([item] * count) + b"]"
    if kind == "string":
        if "format" in schema:
            example = _FORMAT_EXAMPLES.get(schema["format"])
            return None if example is None else _encodings(example)[0]
        if "pattern" in schema:
            rest = _pattern_rest(schema["pattern"], "")
            return None if rest is None else _encodings(rest)[0]
        return b'"' + b"a" * schema.get("minLength", 0) + b'"'
    if kind == "number":
        return _minimal_number(schema)
    return {"boolean": b"false", "null": b"null"}.get(kind)


def _minimal_number(schema: dict) -> bytes | None:
    """The integer nearest 0 within the schema's bounds."""
    low, high = -math.inf, math.inf
    if "minimum" in schema:
        low = math.ceil(schema["minimum"])
    if "exclusiveMinimum" in schema:
        low = max(low, math.floor(schema["exclusiveMinimum"]) + 1)
    if "maximum" in schema:
        high = math.floor(schema["maximum"])
    if "exclusiveMaximum" in schema:
        high = min(high, math.ceil(schema["exclusiveMaximum"]) - 1)
    value = 0 if low <= 0 <= high else (low if low > 0 else high)
    if not low <= value <= high:
        return None
    if value and schema.get("multipleOf"):
        return None
    return str(int(value)).encode()


def _finish_string(root: dict, raw: bytes, schema: Any) -> bytes | None:
    """The shortest rest found of a string value begun as raw (its opening quote included)."""
    finishes = _string_finishes(root, raw, schema)
    return finishes[0] if finishes else None


def _string_finishes(root: dict, raw: bytes, schema: Any) -> list[bytes]:
    """Every rest of a string value begun as raw that the schema's alternatives allow: each enum or const value
    it begins, or the string closed (after an escape's or a character's rest, padded to minLength)."""
    finishes = []
    for alt in _alternatives(root, schema):
        values = [alt["const"]] if "const" in alt else alt.get("enum")
        if values is not None:
            finishes += [encoded[len(raw):] for value in values if isinstance(value, str)
                         for encoded in _encodings(value) if encoded.startswith(raw)]
        elif _kind_of(alt) in ("string", None) and "format" not in alt:
            rest = _string_tail(raw)
            try:
                begun = json.loads(raw + rest + b'"')
            except ValueError:
                continue
            if "pattern" in alt:
                more = _pattern_rest(alt["pattern"], begun)
                if more is not None:
                    finishes.append(rest + _encodings(more)[0][1:])  # its characters as JSON, then the quote
            else:
                finishes.append(rest + b"a" * max(0, alt.get("minLength", 0) - len(begun)) + b'"')
    return finishes


@functools.lru_cache(maxsize=4096)
def _pattern_rest(pattern: str, begun: str) -> str | None:
    """Characters that make begun + them match pattern whole, found depth first (the first character of
    _PATTERN_CHARACTERS that keeps a match possible, then the next); None when none is found."""
    try:
        compiled = regex.compile(pattern)
    except regex.error:
        return None
    steps = [0]

    def extend(text: str) -> str | None:
        if compiled.fullmatch(text):
            return text
        for char in _PATTERN_CHARACTERS:
            steps[0] += 1
            if steps[0] > _PATTERN_SEARCH_STEPS or len(text) > len(begun) + 64:
                return None
            if compiled.fullmatch(text + char, partial=True):
                found = extend(text + char)
                if found is not None:
                    return found
        return None

    if not compiled.fullmatch(begun, partial=True):
        return None
    found = extend(begun)
    return None if found is None else found[len(begun):]


def _string_tail(raw: bytes) -> bytes:
    """What a string's bytes need before its closing quote: an escape's rest, a UTF-8 character's rest."""
    escape = _ESCAPE_TAIL.search(raw)
    if escape is not None and len(escape.group(1)) % 2 == 1:
        if escape.group(2) is None:
            return b"\\"  # a lone backslash: an escaped backslash
        return b"0" * (5 - len(escape.group(2)))  # \\u and fewer than 4 hex digits
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        missing = need - back
        if missing <= 0:
            return b""
        first = {0xE0: 0xA0, 0xF0: 0x90}.get(byte, 0x80) if back == 1 else 0x80
        return bytes([first] + [0x80] * (missing - 1))
    return b""
