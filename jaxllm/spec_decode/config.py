"""SpeculativeConfig: vLLM's speculative_config, as a checked frozen dataclass.

    {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b}

As vLLM: prompt_lookup_min and prompt_lookup_max default to 5 when both are unset, and to each other when one is;
"model": "ngram" (or "[ngram]") without a method means the n-gram method. A draft model ("model": a path, or
method "draft_model") is refused: only n-gram proposals are built. An unknown key, a wrong type or a value out
of range is a ValueError naming the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

METHODS = ("ngram",)
NGRAM_MODEL_NAMES = ("ngram", "[ngram]")
MAX_SPECULATIVE_TOKENS = 16  # more rows per sequence than this would crowd out the other sequences' samples


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

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
        return cls(method, k, lo, hi)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _method(method: Any, model: Any) -> str:
    if model is not None and model not in NGRAM_MODEL_NAMES:
        raise ValueError(f"speculative_config: model {model!r}: a draft model is not supported yet (only "
                         f"method 'ngram')")
    if method is None:
        if model is None:
            raise ValueError("speculative_config: method is required ('ngram')")
        return "ngram"
    if method == "[ngram]":
        method = "ngram"
    if method not in METHODS:
        raise ValueError(f"speculative_config: method {method!r} is not supported (only 'ngram'; draft models, "
                         f"EAGLE and MTP are not built)")
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
