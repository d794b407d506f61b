"""Values read from model files, checked where they enter.

Every format's configuration (config.json, GGUF metadata, a jaxllm checkpoint's description, adapter_config.json)
is read through a FieldReader: each value is taken by key with its type, its range and, for numbers, finiteness
checked, and a value that fails is a ModelLoadError naming the file, the key and the problem. read_json reads a
file's JSON object with the size of the file bounded, so that no hostile file is a traceback or a memory bomb.

    r = FieldReader(json_dict, "model/config.json")
    r.integer("num_hidden_layers")                  # required: an int in [1, MAX_INT]
    r.number("rms_norm_eps", 1e-6, maximum=1.0)     # a finite real in (0, 1], 1e-6 when absent or null
"""

from __future__ import annotations

import json
import math
import os
import reprlib
from pathlib import Path
from typing import Any, Iterable, Mapping

from jaxllm.errors import ModelLoadError

MAX_INT = 2**31 - 1  # sizes, ids and positions end up in int32 arrays
MAX_JSON_BYTES = 64 << 20  # a model's JSON files are kilobytes (a large index: a few MB)
REQUIRED = object()  # the default of a field that must be present

_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 60, 60, 4, 4


def short_repr(value: Any) -> str:
    """repr(value) cut to a few dozen characters: a hostile file's value is quoted, never copied whole."""
    return _short.repr(value)


def read_json(path: str | os.PathLike, what: str = "a JSON object") -> dict:
    """The JSON object in the file at `path`; ModelLoadError naming the file when it is too large, not UTF-8, not
    JSON, nested too deep, or not an object."""
    path = Path(path)
    try:
        size = path.stat().st_size
        data = None if size > MAX_JSON_BYTES else path.read_bytes()
    except OSError as e:
        raise ModelLoadError(path, f"cannot be read ({e.strerror or e})") from e
    if data is None:
        raise ModelLoadError(path, f"is {size} bytes, more than the {MAX_JSON_BYTES >> 20} MiB a model's JSON file "
                             "may have")
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ModelLoadError(path, f"not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise ModelLoadError(path, f"must hold {what}, got {type(value).__name__}")
    return value


class FieldReader:
    """Typed, range-checked reads from one mapping read from a model file.

    A key that is absent or null takes the default; without a default it is a missing required field. `prefix`
    names a nested section in messages ("rope_scaling.factor")."""

    def __init__(self, values: Mapping[str, Any], source: str | os.PathLike, prefix: str = ""):
        self.values, self.source, self.prefix = values, str(source), prefix

    def error(self, key: str, problem: str) -> ModelLoadError:
        return ModelLoadError(self.source, f"{self.prefix}{key} {problem}")

    def has(self, key: str) -> bool:
        return self.values.get(key) is not None

    def raw(self, key: str, default: Any = REQUIRED) -> Any:
        """The value as it is (the default when absent or null)."""
        value = self.values.get(key)
        return self._default(key, default) if value is None else value

    def _default(self, key: str, default: Any) -> Any:
        if default is REQUIRED:
            raise ModelLoadError(self.source, f"missing required field {self.prefix + key!r}")
        return default

    def integer(self, key: str, default: Any = REQUIRED, *, minimum: int = 1, maximum: int = MAX_INT) -> Any:
        value = self.values.get(key)
        if value is None:
            return self._default(key, default)
        if not _is_int(value) or not minimum <= value <= maximum:
            raise self.error(key, f"must be an integer in [{minimum}, {maximum}], got {short_repr(value)}")
        return int(value)

    def number(self, key: str, default: Any = REQUIRED, *, minimum: float = 0.0, maximum: float = math.inf,
               allow_minimum: bool = False) -> Any:
        """A finite real number above `minimum` (or equal to it with allow_minimum) and at most `maximum`."""
        value = self.values.get(key)
        if value is None:
            return self._default(key, default)
        low_ok = _is_real(value) and (value >= minimum if allow_minimum else value > minimum)
        if not low_ok or not math.isfinite(value) or value > maximum:
            kind = "a positive number" if minimum == 0 and not allow_minimum else \
                f"a number {'>=' if allow_minimum else '>'} {minimum:g}"
            upper = f" <= {maximum:g}" if maximum < math.inf else ""
            raise self.error(key, f"must be {kind}{upper} (finite), got {short_repr(value)}")
        return float(value)

    def flag(self, key: str, default: Any = REQUIRED) -> Any:
        value = self.values.get(key)
        if value is None:
            return self._default(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {short_repr(value)}")
        return value

    def text(self, key: str, default: Any = REQUIRED, choices: Iterable[str] | None = None) -> Any:
        value = self.values.get(key)
        if value is None:
            return self._default(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {short_repr(value)}")
        if choices is not None and value not in choices:
            raise self.error(key, f"{short_repr(value)} is not supported (supported: {', '.join(sorted(choices))})")
        return value

    def text_list(self, key: str) -> list[str]:
        """A list of strings ([] when absent)."""
        value = self.raw(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"must be a list of strings, got {short_repr(value)}")
        return value

    def token_ids(self, key: str) -> tuple[int, ...]:
        """A token id or a list of them (() when absent), each in [0, MAX_INT]."""
        value = self.raw(key, [])
        ids = value if isinstance(value, list) else [value]
        if not all(_is_int(v) and 0 <= v <= MAX_INT for v in ids):
            raise self.error(key, f"must be a token id or a list of token ids (integers >= 0), got "
                             f"{short_repr(value)}")
        return tuple(int(v) for v in ids)

    def section(self, key: str, default: Any = None) -> FieldReader | None:
        """The nested object at `key` as a reader (the default when absent)."""
        value = self.values.get(key)
        if value is None:
            return self._default(key, default)
        if not isinstance(value, Mapping):
            raise self.error(key, f"must be an object, got {short_repr(value)}")
        return FieldReader(value, self.source, f"{self.prefix}{key}.")

    def refuse_unknown(self, known: Iterable[str]) -> None:
        unknown = sorted(set(self.values) - set(known))
        if unknown:
            raise ModelLoadError(self.source, f"unknown field{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(self.prefix + str(k) for k in unknown[:4])}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
