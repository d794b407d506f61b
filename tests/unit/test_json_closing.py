"""JsonPrefix.closing(): every beginning of a valid document (cut at every byte, fed in random pieces) is finished
into a document the schema accepts (jsonschema), in xgrammar's one-line layout; what the closer cannot satisfy
gives None."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from jaxllm.structured_outputs.json_closing import JsonPrefix
from jaxllm.tool_calling import required_schema

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "required": ["query", "filters"], "properties": {
            "query": {"type": "string", "minLength": 2},
            "filters": {"type": "array", "items": {"$ref": "#/$defs/filter"}, "minItems": 1},
            "exact": {"type": "boolean"}, "score": {"type": "number", "exclusiveMinimum": 0.5}},
        "$defs": {"filter": {"type": "object", "properties": {"k": {"type": "string"},
                                                            "v": {"type": ["number", "null"]}},
                             "required": ["k", "v"]}}}}},
    {"type": "function", "function": {"name": "sear", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "minItems": 2}},
        "required": ["tags"]}}},
]
SCHEMA = required_schema(TOOLS)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
DOCUMENTS = [
    [{"name": "get_weather", "parameters": {"city": 'Zürich "x" \\ ü 日本 🎉', "unit": "C", "days": 3}}],
    [{"name": "search", "parameters": {"query": "cheap é flights", "filters": [{"k": "a", "v": -1.5e3},
                                                                                {"k": "b", "v": None}],
                                       "exact": True, "score": 12.25}},
     {"name": "get_weather", "parameters": {"city": "Oslo", "days": 7}}],
    [{"name": "sear", "parameters": {"tags": ["bb", "a", "a"]}}],
]


def layouts(document) -> list[bytes]:
    """The document as xgrammar writes it without free whitespace, with non-ASCII characters as they are and as
    \\u escapes, and compact (what a grammar that allows any whitespace may also see)."""
    return [json.dumps(document, ensure_ascii=ascii, separators=separators).encode()
            for ascii in (False, True) for separators in ((", ", ": "), (",", ":"))]


def fed(schema: dict, data: bytes, rng: random.Random) -> JsonPrefix:
    prefix = JsonPrefix(schema)
    i = 0
    while i < len(data):
        j = min(len(data), i + rng.randint(1, 6))
        prefix.feed(data[i:j])
        i = j
    return prefix


@pytest.mark.parametrize("document", DOCUMENTS, ids=["unicode", "nested", "enum-array"])
def test_every_cut_is_finished_into_a_valid_document(document):
    jsonschema.validate(document, SCHEMA)
    rng = random.Random(0)
    for data in layouts(document):
        for cut in range(len(data) + 1):
            closing = fed(SCHEMA, data[:cut], rng).closing()
            assert closing is not None, data[:cut]
            VALIDATOR.validate(json.loads(data[:cut] + closing))
        assert fed(SCHEMA, data, rng).closing() == b""


@pytest.mark.parametrize("prefix, closing", [
    (b"", b'[{"name": "get_weather", "parameters": {"city": "", "days": 1}}]'),
    (b'[{"name": "sea', b'rch", "parameters": {"query": "aa", "filters": [{"k": "", "v": 0}]}}]'),
    (b'[{"name": "sear", ', b'"parameters": {"tags": ["a", "a"]}}]'),  # "sear" is whole: its own tool
    (b'[{"name": "get_weather", "parameters": {"city": "Par', b'", "days": 1}}]'),
    (b'[{"name": "get_weather", "parameters": {"city": "a\\', b'\\", "days": 1}}]'),  # a lone backslash
    (b'[{"name": "get_weather", "parameters": {"city": "\\u00', b'00", "days": 1}}]'),
    (b'[{"name": "get_weather", "parameters": {"city": "\xe6\x97', b'\x80", "days": 1}}]'),  # a cut character
    (b'[{"name": "get_weather", "parameters": {"city": "x", "days": 1', b"}}]"),
    (b'[{"name": "get_weather", "parameters": {"city": "x", "unit": "', b'C", "days": 1}}]'),
    (b'[{"name": "get_weather", "parameters": {"city": "x",', b' "days": 1}}]'),  # the separator's space
    (b'[{"name": "search", "parameters": {"query": "qq", "filters": [{"k": "a", "v": 1e', b"0}]}}]"),
    (b'[{"name": "search", "parameters": {"query": "qq", "filters": [{"k": "a", "v": nu', b"ll}]}}]"),
    (b'[{"name": "search", "parameters": {"query": "qq", "filters": [{"k": "a", "v": 1}], "', b'exact": false}}]'),
    (b'[{"name": "search", "parameters": {"query": "qq", "filters": [], "exact": true, "score": ', b"1}}]"),
])
def test_the_shortest_closing(prefix, closing):
    """Missing required properties get minimal values, in the schema's order; a string's escape or character is
    finished; an enum value or a key is written out; the closing is the shortest this reader builds."""
    found = fed(SCHEMA, prefix, random.Random(1)).closing()
    assert found == closing
    if b"filters\": []" not in prefix:  # minItems: that prefix is not valid, only read
        jsonschema.validate(json.loads(prefix + found), SCHEMA)


CODES = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
                                         "when": {"type": "string", "format": "date"}}, "required": ["code", "when"]}


@pytest.mark.parametrize("prefix, closing", [
    (b"", b'{"code": "AA000", "when": "2000-01-01"}'),
    (b'{"code": "Q', b'A000", "when": "2000-01-01"}'),
    (b'{"code": "QZ12', b'0", "when": "2000-01-01"}'),
    (b'{"code": "QZ123', b'", "when": "2000-01-01"}'),
])
def test_a_pattern_is_finished_and_a_format_has_an_example(prefix, closing):
    found = fed(CODES, prefix, random.Random(3)).closing()
    assert found == closing
    jsonschema.Draft202012Validator(CODES, format_checker=jsonschema.FormatChecker()).validate(
        json.loads(prefix + found))


@pytest.mark.parametrize("schema, prefix", [
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["code"]},
     b'{"code": "a'),  # not a beginning the pattern allows (the grammar would not have written it)
    ({"type": "object", "properties": {"when": {"type": "string", "format": "date"}}, "required": ["when"]},
     b'{"when": "20'),  # a format string begun
    ({"type": "object", "properties": {"when": {"type": "string", "format": "ipv7"}}, "required": ["when"]}, b"{"),
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "integer"}]}}, "required": ["a"]}, b'{"a": '),
    ({"type": "object", "properties": {}, "required": ["hidden"]}, b"{"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, b""),
])
def test_what_it_cannot_satisfy_gives_none(schema, prefix):
    assert JsonPrefix(schema).closing() is None if not prefix else fed(schema, prefix, random.Random(2)).closing() \
        is None


def test_items_of_any_kind_and_a_dangling_ref_are_read():
    anything = {"type": "object", "properties": {"xs": {"type": "array", "items": True, "minItems": 2}},
                "required": ["xs"]}
    assert fed(anything, b'{"xs": [1, "a', random.Random(4)).closing() == b'"]}'
    assert fed(anything, b'{"xs": [', random.Random(4)).closing() == b'null, null]}'
    dangling = {"type": "object", "properties": {"xs": {"$ref": "#/nothing"}}, "required": ["xs"]}
    assert fed(dangling, b'{"xs": [', random.Random(4)).closing() == b"]}"


def test_a_byte_out_of_place_gives_none():
    prefix = JsonPrefix({"type": "object", "properties": {"a": {"type": "integer"}}})
    prefix.feed(b'{"a": 1]')
    assert prefix.failed and prefix.closing() is None


def test_a_copy_reads_on_apart_from_its_original():
    prefix = JsonPrefix(SCHEMA)
    prefix.feed(b'[{"name": "get_weather", "parameters": {"city": "Os')
    other = prefix.copy()
    other.feed(b'lo", "days": 2}}]')
    assert other.done and other.closing() == b""
    assert prefix.closing() == b'", "days": 1}}]'
