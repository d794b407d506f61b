"""The request fields that ask for structured outputs, as vLLM's server reads them, turned into one
StructuredOutputsParams:

    response_format      {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name", "schema",
                         "strict", "description"}} | {"type": "structural_tag", ...} ({"type": "text"}: none)
    structured_outputs   an object of StructuredOutputsParams' fields (json, regex, choice, grammar, ...)
    guided_json, guided_regex, guided_choice, guided_grammar, structural_tag, guided_whitespace_pattern,
    guided_decoding_backend      vLLM's older names of the same

At most one of them may ask for a constraint (a 400 names them otherwise). A structured_outputs object that asks
for none (only options: disable_any_whitespace, ...) applies its options to the constraint another field gives, as
vLLM merges response_format into structured_outputs. The params remember the field they came from, so that a
constraint that does not parse is a 400 naming that field.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jaxllm.structured_outputs.params import KINDS, StructuredOutputsParams, from_dict

BACKENDS = ("auto", "xgrammar")  # guided_decoding_backend values served here, with options after a colon
BACKEND_OPTIONS = {"disable-any-whitespace": "disable_any_whitespace", "no-fallback": "disable_fallback",
                   "disable-additional-properties": "disable_additional_properties"}
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
          "structural_tag": "structural_tag"}


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # as protocol.py's: unknown fields are ignored


class JsonSchemaFormat(OpenAIBaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputFields(OpenAIBaseModel):
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The request's constraint (None: none); ValueError starting with the field's name."""
        options = self._backend_options()
        asked = self._asking_fields()
        if len(asked) > 1:
            raise ValueError(f"{asked[0]}: only one structured-output constraint per request, got "
                             f"{', '.join(asked)}")
        if not asked:
            if self.guided_whitespace_pattern is not None:
                raise ValueError("guided_whitespace_pattern: needs guided_json")
            return None
        field = asked[0]
        try:
            params = self._params_of(field)
            if options:
                params = dataclasses.replace(params, **options)
        except (ValueError, TypeError) as e:
            raise _naming(field, e) from None
        if field != "structured_outputs" and self.structured_outputs:
            params = _with_options(params, self.structured_outputs)
        params.source_field = field
        return params

    def _backend_options(self) -> dict[str, bool]:
        """guided_decoding_backend "xgrammar[:option,option]" (vLLM's older form) -> the options it sets."""
        if self.guided_decoding_backend is None:
            return {}
        name, _, options = self.guided_decoding_backend.partition(":")
        if name not in BACKENDS:
            raise ValueError(f"guided_decoding_backend: {name!r} is not available; this server uses xgrammar "
                             f"('xgrammar' or 'auto')")
        chosen = [o.strip() for o in options.split(",") if o.strip()]
        unknown = [o for o in chosen if o not in BACKEND_OPTIONS]
        if unknown:
            raise ValueError(f"guided_decoding_backend: unknown option {unknown[0]!r} (known: "
                             f"{', '.join(BACKEND_OPTIONS)})")
        return {BACKEND_OPTIONS[o]: True for o in chosen}

    def _asking_fields(self) -> list[str]:
        """The fields that give a constraint; structured_outputs holding options only gives none unless no other
        field does (then it is refused: it must give one)."""
        asked = [name for name in GUIDED if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            asked.insert(0, "response_format")
        given = self.structured_outputs
        if given is not None and (not asked or any(given.get(kind) not in (None, False) for kind in KINDS)):
            asked.insert(1 if asked[:1] == ["response_format"] else 0, "structured_outputs")
        return asked

    def _params_of(self, field: str) -> StructuredOutputsParams:
        if field == "response_format":
            return _from_response_format(self.response_format)
        if field == "structured_outputs":
            return from_dict(self.structured_outputs)
        value = getattr(self, field)
        options = {}
        if field == "guided_json" and self.guided_whitespace_pattern is not None:
            options["whitespace_pattern"] = self.guided_whitespace_pattern
        return StructuredOutputsParams(**{GUIDED[field]: value}, **options)


def _with_options(params: StructuredOutputsParams, options: dict[str, Any]) -> StructuredOutputsParams:
    """params with the options of a structured_outputs object that gives no constraint of its own."""
    names = {f.name for f in dataclasses.fields(StructuredOutputsParams)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"structured_outputs: unknown field {unknown[0]!r} (known: {', '.join(sorted(names))})")
    options = {name: value for name, value in options.items() if name not in KINDS}  # kinds here are null/false
    try:
        return dataclasses.replace(params, **options)
    except (ValueError, TypeError) as e:
        raise _naming("structured_outputs", e) from None


def _naming(field: str, error: Exception) -> ValueError:
    """The error's message starting with "<field>: " (once: StructuredOutputsParams' own may already)."""
    message = str(error)
    return ValueError(message if message.startswith(f"{field}: ") else f"{field}: {message}")


def _from_response_format(response_format: ResponseFormat) -> StructuredOutputsParams:
    if response_format.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if response_format.type == "structural_tag":
        return StructuredOutputsParams(structural_tag=json.dumps(response_format.model_dump(exclude_none=True)))
    schema = response_format.json_schema
    if schema is None or schema.json_schema is None:
        raise ValueError("type json_schema needs json_schema.schema")
    return StructuredOutputsParams(json=schema.json_schema)
