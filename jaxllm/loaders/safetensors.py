"""Hugging Face model directories: config.json + model.safetensors or a sharded model.safetensors.index.json.

AutoAWQ checkpoints (config.json's quantization_config) go the same way: awq.join_linears turns each quantized
linear's three tensors into one packed weight before the names are mapped to fields."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from safetensors import safe_open

from jaxllm.config import ModelConfig, merge_token_ids
from jaxllm.errors import ModelLoadError
from jaxllm.loaders import awq
from jaxllm.loaders.assemble import assemble_params, numpy_dtype, tensor_field
from jaxllm.model.params import LlamaParams

_GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo", "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv", "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}
# a quantized linear's packed weight stands for its dense `weight` (awq.join_linears names it `qweight`)
_AWQ_LAYER_NAMES = {**_LAYER_NAMES, **{name.replace(".weight", ".qweight"): field for name, field in
                                       _LAYER_NAMES.items() if name.rpartition(".")[0] in awq.LINEAR_MODULES}}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IGNORED_SUFFIX = "rotary_emb.inv_freq"  # old checkpoints store the rope table; it is recomputed


def read_hf_config(model_dir: Path) -> ModelConfig:
    return _model_config(read_config_json(model_dir), model_dir)


def read_config_json(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(path, "missing: a Hugging Face model directory needs config.json")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(path, f"not valid JSON ({e})") from e
    if not isinstance(hf, dict):
        raise ModelLoadError(path, f"must hold a JSON object, got {type(hf).__name__}")
    return hf


def _model_config(hf: dict, model_dir: Path) -> ModelConfig:
    config = ModelConfig.from_hf_config(hf, source=str(model_dir / "config.json"))
    extra_eos = _generation_eos_token_ids(model_dir)
    if extra_eos is None:
        return config
    try:
        return dataclasses.replace(config, eos_token_ids=merge_token_ids(config.eos_token_ids, extra_eos))
    except ValueError as e:
        raise ModelLoadError(model_dir / "generation_config.json", str(e)) from e


def _generation_eos_token_ids(model_dir: Path) -> int | list[int] | None:
    """generation_config.json's eos_token_id (an id or a list; Llama 3 Instruct lists <|eot_id|> there), if any."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return None
    try:
        generation = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(path, f"not valid JSON ({e})") from e
    return generation.get("eos_token_id") if isinstance(generation, dict) else None


def load_hf_dir(model_dir: Path, dtype: str = "float32",
                quantization: str | None = None) -> tuple[ModelConfig, LlamaParams]:
    """The config and host (numpy) params, cast to dtype tensor by tensor (AWQ linears stay packed, in their own
    dtypes). quantization: None reads what config.json says; "awq" also insists on an AWQ checkpoint."""
    hf = read_config_json(model_dir)
    config = _model_config(hf, model_dir)
    awq_config = awq.read_awq_config(hf, model_dir / "config.json", quantization)
    named = (t for f in weight_files(model_dir) for t in _read_file(f))
    layer_names = _LAYER_NAMES
    if awq_config is not None:
        named, layer_names = awq.join_linears(named, awq_config, numpy_dtype(dtype)), _AWQ_LAYER_NAMES
    return config, assemble_params(config, _fields(named, config, layer_names), source=str(model_dir), dtype=dtype)


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(index, f"not a valid safetensors index ({e!r})") from e
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(model_dir, "no *.safetensors weights found (pickle checkpoints such as "
                                 "pytorch_model.bin are refused: unpickling can run arbitrary code)")
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f, "missing weight shard listed in model.safetensors.index.json")
    return files


def _fields(named: Iterator[tuple[Path, str, Any]], config: ModelConfig, layer_names: dict[str, str]
            ) -> Iterator[tuple[str, int | None, str, Any]]:
    """(file, tensor name, weight) -> (params field, layer or None, name, weight) for assemble_params."""
    for path, name, weight in named:
        field, layer = tensor_field(name, _GLOBAL_NAMES, _LAYER_RE, layer_names)
        if field is None:
            if name.endswith(_IGNORED_SUFFIX):
                continue
            raise ModelLoadError(path, f"unexpected tensor {name!r}")
        if field == "lm_head" and config.tie_word_embeddings:
            continue  # tied: the output projection is the embedding
        yield field, layer, name, weight


def _read_file(path: Path) -> Iterator[tuple[Path, str, np.ndarray]]:
    """(path, name, array) of each tensor in one safetensors file, as host numpy arrays."""
    try:
        with safe_open(str(path), framework="numpy") as f:  # host arrays: no device sees a tensor while loading
            for name in f.keys():
                yield path, name, f.get_tensor(name)
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise ModelLoadError(path, f"cannot read safetensors file (truncated or corrupt?): {e}") from e
