"""The default sampling parameters a model's generation config gives (vLLM's --generation-config and
--override-generation-config).

generation_config: "auto" reads the model's own: a directory model's generation_config.json (Hugging Face or
jaxllm checkpoint), a GGUF file's general.sampling.* metadata; "vllm" reads none; any other value is a folder
holding the generation_config.json to read. Of it, as in vLLM, only repetition_penalty, temperature, top_k, top_p,
min_p and max_new_tokens (SamplingParams' max_tokens) are taken (do_sample is ignored, as vLLM does); the
override's keys (those six) replace or add to them, a null one removing the file's value. The result, in
SamplingParams' names, is what a request's unset fields default to (vLLM's get_diff_sampling_param).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping

from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import FieldReader, read_json
from jaxllm.loaders.resolve import ModelSource

logger = logging.getLogger(__name__)

FILE_NAME = "generation_config.json"
# Hugging Face's name -> its check, as SamplingParams' own (a value absent or null reads as None)
_FIELDS: dict[str, Callable[[FieldReader, str], Any]] = {
    "repetition_penalty": lambda r, key: r.number(key, None),
    "temperature": lambda r, key: r.number(key, None, allow_minimum=True),
    "top_k": lambda r, key: r.integer(key, None, minimum=-1),
    "top_p": lambda r, key: r.number(key, None, maximum=1.0),
    "min_p": lambda r, key: r.number(key, None, allow_minimum=True, maximum=1.0),
    "max_new_tokens": lambda r, key: r.integer(key, None),
}
FIELDS = tuple(_FIELDS)
SAMPLING_NAMES = {"max_new_tokens": "max_tokens"}  # Hugging Face's name -> SamplingParams', where they differ
# llama.cpp's recommended sampling in a GGUF's metadata -> Hugging Face's name (its penalty_repeat covers only the
# last penalty_last_n tokens, not the repetition_penalty of the whole sequence: it is not taken)
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
             "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p"}


def check_override(values: Any) -> dict[str, Any]:
    """The override (a dict of the six keys; null allowed), as given; ValueError naming the key otherwise."""
    if not isinstance(values, dict):
        raise ValueError(f"must be a JSON object of generation config keys, got {type(values).__name__}")
    for key in values:
        if key not in _FIELDS:
            hint = "; max_new_tokens sets max_tokens" if key == "max_tokens" else ""
            raise ValueError(f"unknown key {key!r} (known: {', '.join(FIELDS)}){hint}")
    try:
        _read(FieldReader(values, "override"), {key: key for key in values})
    except ModelLoadError as e:
        raise ValueError(e.problem) from None
    return values


def override_from_json(text: str) -> dict[str, Any]:
    """--override-generation-config's value: a JSON object, checked by check_override."""
    try:
        values = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    return check_override(values)


def sampling_defaults(generation_config: str, override: Mapping[str, Any] | None,
                      model: ModelSource | None) -> dict[str, Any]:
    """The default sampling values (SamplingParams' names) from generation_config ("auto": the model's, "vllm":
    none, else a folder's generation_config.json) with `override` (checked by check_override) applied; logged
    when there are any."""
    found, where = _generation_config(generation_config, model)
    merged = {**found, **{SAMPLING_NAMES.get(key, key): value for key, value in (override or {}).items()}}
    defaults = {name: value for name, value in merged.items() if value is not None}
    if defaults:
        sources = [where] * bool(found) + ["override_generation_config"] * bool(override)
        logger.warning("default sampling parameters from %s: %s (a request's own values win; "
                       "generation_config='vllm' ignores the model's)", " and ".join(sources),
                       ", ".join(f"{name}={value}" for name, value in defaults.items()))
    return defaults


def _generation_config(choice: str, model: ModelSource | None) -> tuple[dict[str, Any], str]:
    """(the values found, where) for generation_config's value."""
    if choice == "vllm":
        return {}, ""
    if choice != "auto":
        return _folder_values(Path(choice).expanduser())
    if model is None:  # params made in memory: no files
        return {}, ""
    if model.kind == "gguf":
        return _gguf_values(model.path), f"{model.path} (general.sampling)"
    path = Path(model.path) / FILE_NAME
    return (_file_values(path), str(path)) if path.is_file() else ({}, "")


def _folder_values(folder: Path) -> tuple[dict[str, Any], str]:
    path = folder / FILE_NAME
    if not path.is_file():
        raise ModelLoadError(path, "not found: generation_config takes 'auto' (the model's), 'vllm' (none) or a "
                             f"folder holding {FILE_NAME}")
    return _file_values(path), str(path)


def _file_values(path: Path) -> dict[str, Any]:
    return _read(FieldReader(read_json(path), path), {key: key for key in FIELDS})


def _gguf_values(path: Path) -> dict[str, Any]:
    from jaxllm.loaders.gguf import open_gguf

    values = _read(FieldReader(open_gguf(path).metadata, path), GGUF_KEYS)
    # float32 in the file: 0.7 reads back as 0.699999988; seven significant digits give 0.7 again
    return {name: float(f"{v:.7g}") if isinstance(v, float) else v for name, v in values.items()}


def _read(reader: FieldReader, keys: Mapping[str, str]) -> dict[str, Any]:
    """{SamplingParams' name: value} of the keys present (file key -> Hugging Face name), each checked."""
    values = {SAMPLING_NAMES.get(name, name): _FIELDS[name](reader, key) for key, name in keys.items()}
    return {name: value for name, value in values.items() if value is not None}
