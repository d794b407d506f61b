"""The JSON Schema keywords that the grammar backend (xgrammar) accepts but does not enforce: a schema holding one
would let the output break it silently, so it is refused, naming where (vLLM's xgrammar backend refuses the same
kinds of schema). Each was checked against xgrammar's grammar: it accepts a string the keyword forbids.

    uniqueItems: true                            repeated items are accepted
    contains                                     an array without a matching item is accepted
    not, if / then / else                        ignored
    dependentRequired, dependentSchemas          ignored
    minLength / maxLength beside pattern / format   the length bounds are dropped
"""

from __future__ import annotations

from typing import Any

_IGNORED = ("contains", "not", "if", "then", "else", "dependentRequired", "dependentSchemas")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_VALUES = ("enum", "const", "default", "examples")  # data, not schemas


def unenforced_keyword(schema: Any, path: str = "") -> str | None:
    """'<path>: <keyword> ...' for the first keyword of `schema` the grammar would not enforce, or None."""
    if isinstance(schema, list):
        return next((found for i, item in enumerate(schema) if (found := unenforced_keyword(item, f"{path}[{i}]"))),
                    None)
    if not isinstance(schema, dict):
        return None
    where = path or "the schema's root"
    if schema.get("uniqueItems") is True:
        return f"{where}: uniqueItems is not enforced by the grammar (repeated items would pass)"
    for keyword in _IGNORED:
        if keyword in schema:
            return f"{where}: {keyword} is not enforced by the grammar"
    if any(k in schema for k in ("pattern", "format")) and any(k in schema for k in ("minLength", "maxLength")):
        return f"{where}: minLength / maxLength beside pattern or format are not enforced by the grammar"
    for key, value in schema.items():
        if key in _VALUES:
            continue
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            found = next((f for name, sub in value.items() if (f := unenforced_keyword(sub, _join(path, key, name)))),
                         None)
        else:
            found = unenforced_keyword(value, _join(path, key))
        if found:
            return found
    return None


def _join(path: str, *keys: str) -> str:
    return ".".join([path, *keys] if path else keys)
