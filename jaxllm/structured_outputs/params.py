"""StructuredOutputsParams: the constraint a request's output must follow (vLLM's class and field names).

Exactly one kind is given:

    json           a JSON schema (dict, or its JSON text); the output is one JSON value valid under it
    json_object    True: any JSON object (the schema {"type": "object"}, as vLLM)
    regex          the output matches the regular expression, whole
    choice         the output is one of the strings, exactly
    grammar        an EBNF grammar (xgrammar's dialect: `root ::= ...`), the output derived from `root`
    structural_tag xgrammar's structural tag (JSON text): free text with tagged, schema-constrained parts

Options: disable_any_whitespace (JSON without whitespace between tokens), disable_additional_properties (objects
of the schema take no properties beyond those it names; xgrammar's strict mode: the default here, as in vLLM's
xgrammar backend), disable_fallback (accepted: there is one backend and no fallback).

The constraint is parsed by parsed() (kept on the object, so that a server parses it off the engine thread and the
engine reuses it); a bad schema, regex or grammar raises ValueError naming the field and the parser's message.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any

from jaxllm import optional_deps
from jaxllm.structured_outputs.unenforced import unenforced_keyword

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclasses.dataclass
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        given = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs: exactly one of {', '.join(KINDS)} must be given, got "
                             f"{', '.join(given) if given else 'none'}")
        self._check_types()
        self._parsed = None  # parsed by parsed(), then kept
        self.source_field = "structured_outputs"  # the request field it came from (a server's errors name it)
        self.reasoning_end: str | None = None  # the constraint applies after this text in the output (a server's
        #                                        reasoning parser's end marker, "</think>"): the answer only
        self.close_within_budget = False  # a JSON schema's output is closed before max_tokens or the context
        #                                   ends it (a forced tool call: budget_closing.py)

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    @property
    def key(self) -> tuple:
        """What the grammar depends on: the parse and compile caches' key (a schema's text keeps its properties'
        order: the output follows it)."""
        value = getattr(self, self.kind)
        text = value if isinstance(value, str) else json.dumps(value)
        return self.kind, text, self.disable_any_whitespace

    def parsed(self):
        """The parsed grammar (an xgrammar Grammar): parsed at the first call and kept (and found by its text
        when another request sent the same); ValueError if the constraint is not valid."""
        if self._parsed is None:
            self._parsed = _parse(*self.key)
        return self._parsed

    def _check_types(self) -> None:
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(f"structured_outputs.json must be a JSON schema (an object or its JSON text), got "
                             f"{type(self.json).__name__}")
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None and (not isinstance(self.choice, (list, tuple)) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, got "
                             f"{self.choice!r}")
        if self.json_object not in (None, True, False):
            raise ValueError(f"structured_outputs.json_object must be true or false, got {self.json_object!r}")
        if self.whitespace_pattern is not None:
            raise ValueError("structured_outputs.whitespace_pattern is not supported (the xgrammar backend has no "
                             "whitespace pattern; disable_any_whitespace removes whitespace)")


@functools.lru_cache(maxsize=1024)
def _parse(kind: str, text: str, disable_any_whitespace: bool):
    """The grammar of a constraint given by its key (StructuredOutputsParams.key)."""
    xgr = optional_deps.require("xgrammar", optional_deps.STRUCTURED_OUTPUTS)
    try:
        if kind in ("json", "json_object"):  # json_object: any object (not any JSON value)
            schema = text if kind == "json" else '{"type": "object"}'
            _check_enforced(schema)
            return xgr.Grammar.from_json_schema(schema, any_whitespace=not disable_any_whitespace)
        if kind == "regex":
            return xgr.Grammar.from_regex(text)
        if kind == "choice":  # JSON string escapes are EBNF string escapes
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in json.loads(text)))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(text)
        return xgr.Grammar.from_structural_tag(text)
    except (RuntimeError, ValueError, TypeError) as e:
        raise ValueError(f"structured_outputs.{kind}: {_parser_message(e)}") from None


def _check_enforced(schema_text: str) -> None:
    """ValueError for a schema with a keyword the grammar would not enforce (unenforced.py); a text that is not
    JSON is left to the parser's own message."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return
    problem = unenforced_keyword(schema)
    if problem is not None:
        raise ValueError(f"{problem}; remove it from the schema")


def _parser_message(error: Exception) -> str:
    """xgrammar's message without its log prefix ("[12:00:00] /project/cpp/file.cc:94: ")."""
    text = str(error).strip()
    return re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", text) or type(error).__name__


@dataclasses.dataclass(frozen=True)
class StructuredOutputsConfig:
    """The engine's structured-output settings (vLLM's --structured-outputs-config): backend auto or xgrammar;
    disable_any_whitespace / disable_additional_properties as every request's default; disable_fallback
    accepted (one backend, no fallback)."""

    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    disable_fallback: bool = False

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "xgrammar"):
            raise ValueError(f"backend {self.backend!r} is not available: auto or xgrammar")
        for name in ("disable_any_whitespace", "disable_additional_properties", "disable_fallback"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, fields: dict[str, Any] | None) -> "StructuredOutputsConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields or {}) - names)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(names))})")
        return cls(**(fields or {}))

    def apply(self, params: StructuredOutputsParams) -> StructuredOutputsParams:
        """params with this config's defaults (params itself when they change nothing: its parse is kept)."""
        if self.disable_any_whitespace and not params.disable_any_whitespace:
            changed = dataclasses.replace(params, disable_any_whitespace=True)
            for name in ("source_field", "reasoning_end", "close_within_budget"):
                setattr(changed, name, getattr(params, name))
            return changed
        return params


def from_dict(fields: dict[str, Any]) -> StructuredOutputsParams:
    """The server's `structured_outputs` field (a JSON object) as params; unknown names are a ValueError."""
    names = {f.name for f in dataclasses.fields(StructuredOutputsParams)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"structured_outputs: unknown field {unknown[0]!r} (known: {', '.join(sorted(names))})")
    return StructuredOutputsParams(**fields)
