"""JSON Schema keywords that xgrammar accepts without enforcing are refused, naming where they sit
(structured_outputs/unenforced.py); for each, xgrammar's grammar is shown to accept a value the keyword forbids,
so the refusal stands for a real gap, and schemas that only look alike pass."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from jaxllm.structured_outputs import StructuredOutputsParams
from jaxllm.structured_outputs.unenforced import unenforced_keyword

# (schema, a value it forbids, the path and keyword the refusal names)
UNENFORCED = [
    ({"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}, ["a", "a"],
     "the schema's root: uniqueItems"),
    ({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"},
                                              "contains": {"const": 5}}}},
     {"xs": [1]}, "properties.xs: contains"),
    ({"anyOf": [{"type": "integer"}, {"not": {"type": "string"}}]}, "x", "anyOf[1]: not"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "a", "the schema's root: if"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}}, {"a": 1},
     "the schema's root: dependentRequired"),
    ({"$defs": {"code": {"type": "string", "pattern": "[a-z]+", "maxLength": 2}}, "$ref": "#/$defs/code"}, "abcd",
     "$defs.code: minLength / maxLength beside pattern or format"),
]


@pytest.mark.parametrize("schema,forbidden,named", UNENFORCED, ids=[n.split(": ")[1] for *_, n in UNENFORCED])
def test_a_keyword_the_grammar_ignores_is_refused_naming_where(schema, forbidden, named):
    assert unenforced_keyword(schema).startswith(named)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(forbidden, schema)
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    assert _is_grammar_accept_string(xgr.Grammar.from_json_schema(json.dumps(schema)), json.dumps(forbidden)), (
        "xgrammar now enforces this keyword: it can leave the list")
    with pytest.raises(ValueError, match=r"^structured_outputs\.json: " + re.escape(named)):
        StructuredOutputsParams(json=schema).parsed()


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}}},  # names, not keywords
    {"enum": [{"not": 1}, {"uniqueItems": True}]},  # values, not schemas
    {"type": "array", "uniqueItems": False},
    {"type": "string", "maxLength": 3},
    {"type": "string", "pattern": "[a-z]+"},
])
def test_schemas_that_only_look_alike_pass(schema):
    assert unenforced_keyword(schema) is None
