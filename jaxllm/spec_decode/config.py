"""SpeculativeConfig: vLLM's speculative_config, as a checked frozen dataclass.

    {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b}

    {"model": PATH, "num_speculative_tokens": k}        (or with "method": "draft_model")

As vLLM: prompt_lookup_min and prompt_lookup_max default to 5 when both are unset, and to each other when one is;
"model": "ngram" (or "[ngram]") without a method means the n-gram method; any other "model" is a draft model's
path or name (spec_decode/draft_model.py), and method "draft_model" needs one. EAGLE and MTP are refused. An
unknown key, a wrong type or a value out of range is a ValueError naming the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

METHODS = ("ngram", "draft_model")
NGRAM_MODEL_NAMES = ("ngram", "[ngram]")
MAX_SPECULATIVE_TOKENS = 16  # more rows per sequence than this would crowd out the other sequences' samples


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    model: str | None = None  # the draft model (method "draft_model"); None for n-gram proposals

    @classmethod
    def from_dict(cls, fields: dict[str, Any] | None) -> "SpeculativeConfig | None":
        """None for None (speculation off); else the checked config."""
        if fields is None:
            return None
        if not isinstance(fields, dict):
            raise ValueError(f"speculative_config must be a dict (JSON object), got {type(fields).__name__}")
        known = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise ValueError(f"speculative_config: unknown key {unknown[0]!r} (known: {', '.join(known)})")
        method = _method(fields.get("method"), fields.get("model"))
        model = fields.get("model") if method == "draft_model" else None
        k = _positive_int(fields, "num_speculative_tokens", None)
        if k > MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config: num_speculative_tokens must be <= {MAX_SPECULATIVE_TOKENS}, "
                             f"got {k}")
        given = {name: _positive_int(fields, name, None) for name in ("prompt_lookup_min", "prompt_lookup_max")
                 if fields.get(name) is not None}
        lo = given.get("prompt_lookup_min", given.get("prompt_lookup_max", 5))
        hi = given.get("prompt_lookup_max", lo)
        if lo > hi:
            raise ValueError(f"speculative_config: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        return cls(method, k, lo, hi, model)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _method(method: Any, model: Any) -> str:
    if model is not None and (not isinstance(model, str) or not model):
        raise ValueError(f"speculative_config: model must be a non-empty string (a draft model's path or name, "
                         f"or 'ngram'), got {model!r}")
    if method is None:
        if model is None:
            raise ValueError("speculative_config: method is required ('ngram' or 'draft_model'), or a model")
        return "ngram" if model in NGRAM_MODEL_NAMES else "draft_model"
    if method == "[ngram]":
        method = "ngram"
    if method not in METHODS:
        raise ValueError(f"speculative_config: method {method!r} is not supported (only 'ngram' and "
                         f"'draft_model'; EAGLE and MTP are not built)")
    if method == "draft_model" and (model is None or model in NGRAM_MODEL_NAMES):
        raise ValueError(f"speculative_config: method 'draft_model' needs a model (the draft model's path or "
                         f"name), got {model!r}")
    if method == "ngram" and model is not None and model not in NGRAM_MODEL_NAMES:
        raise ValueError(f"speculative_config: method 'ngram' with model {model!r}: a draft model goes with "
                         f"method 'draft_model'")
    return method


def _positive_int(fields: dict[str, Any], name: str, default: int | None) -> int:
    value = fields.get(name, default)
    if value is None:
        raise ValueError(f"speculative_config: {name} is required")
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"speculative_config: {name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"speculative_config: {name} must be >= 1, got {value}")
    return value
