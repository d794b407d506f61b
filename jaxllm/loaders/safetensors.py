"""Hugging Face model directories: config.json + model.safetensors or a sharded model.safetensors.index.json.

AutoAWQ checkpoints (config.json's quantization_config) go the same way: awq.join_linears turns each quantized
linear's three tensors into one packed weight before the names are mapped to fields."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np
from safetensors import safe_open

from jaxllm.config import ModelConfig, merge_token_ids
from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import FieldReader, read_json, short_repr
from jaxllm.loaders import awq
from jaxllm.loaders.assemble import assemble_params, numpy_dtype, tensor_field
from jaxllm.loaders.host_memory import check_fits_host
from jaxllm.loaders.weight_checks import check_weight
from jaxllm.model.params import LlamaParams, expert_field
from jaxllm.model.weights import WeightFormat

_GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "mlp_norm",
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo", "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv", "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}
# what some families add or name otherwise (architecture.py)
_QK_NORM_NAMES = {"self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm"}
_SANDWICH_NORM_NAMES = {"post_attention_layernorm.weight": "post_attn_norm",
                        "pre_feedforward_layernorm.weight": "mlp_norm",
                        "post_feedforward_layernorm.weight": "post_mlp_norm"}  # Gemma: the MLP's norm is "pre_"
_FUSED_NAMES = {"self_attn.qkv_proj.weight": "w_qkv", "mlp.gate_up_proj.weight": "w_gate_up"}  # Phi-3
# a sparse layer's experts (architecture.experts names their module): each expert's gate, up and down projections
_EXPERT_NAMES = {"block_sparse_moe": {"w1": "gate", "w3": "up", "w2": "down"},  # Mixtral
                 "mlp": {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}}  # Qwen2-MoE, Qwen3-MoE
_SHARED_EXPERT_NAMES = {"mlp.shared_expert.gate_proj.weight": "w_shared_gate",
                        "mlp.shared_expert.up_proj.weight": "w_shared_up",
                        "mlp.shared_expert.down_proj.weight": "w_shared_down",
                        "mlp.shared_expert_gate.weight": "shared_gate"}  # Qwen2-MoE
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IGNORED_SUFFIX = "rotary_emb.inv_freq"  # old checkpoints store the rope table; it is recomputed
INDEX_FILE = "model.safetensors.index.json"


def read_hf_config(model_dir: Path) -> ModelConfig:
    return _model_config(read_config_json(model_dir), model_dir)


def read_config_json(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(path, "missing: a Hugging Face model directory needs config.json")
    return read_json(path)


def _model_config(hf: dict, model_dir: Path) -> ModelConfig:
    config = ModelConfig.from_hf_config(hf, source=str(model_dir / "config.json"))
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return config
    extra_eos = read_json(path).get("eos_token_id")  # an id or a list (Llama 3 Instruct lists <|eot_id|> there)
    try:
        return dataclasses.replace(config, eos_token_ids=merge_token_ids(config.eos_token_ids, extra_eos))
    except ValueError as e:
        raise ModelLoadError(path, str(e)) from e


def load_hf_dir(model_dir: Path, dtype: str = "float32", quantization: str | None = None,
                as_tiles: bool = False) -> tuple[ModelConfig, LlamaParams]:
    """The config and host (numpy) params, cast to dtype tensor by tensor (AWQ linears stay packed, in their own
    dtypes). quantization: None reads what config.json says; "awq" also insists on an AWQ checkpoint. as_tiles:
    assemble_params'."""
    hf = read_config_json(model_dir)
    config = _model_config(hf, model_dir)
    awq_config = awq.read_awq_config(hf, model_dir / "config.json", quantization)
    bytes_per_param = awq.PACKED_BYTES_PER_PARAM if awq_config else np.dtype(numpy_dtype(dtype)).itemsize
    check_fits_host(config, model_dir / "config.json", bytes_per_param)
    named = (t for f in weight_files(model_dir) for t in _read_file(f))
    layer_names = layer_tensor_names(config)
    if awq_config is not None:
        if config.arch.fused_checkpoint:
            raise ModelLoadError(model_dir / "config.json", f"AWQ checkpoints of {config.architecture} (fused "
                                 "qkv_proj / gate_up_proj linears) are not supported")
        awq.check_expert_groups(config, awq_config, model_dir / "config.json")
        named, layer_names = awq.join_linears(named, awq_config, numpy_dtype(dtype)), _awq_names(layer_names)
    return config, assemble_params(config, _fields(named, config, layer_names), source=str(model_dir), dtype=dtype,
                                   as_tiles=as_tiles)


def layer_tensor_names(config: ModelConfig) -> dict[str, str]:
    """A layer's Hugging Face tensor names (after model.layers.N.) -> params fields, for the config's family."""
    arch, names = config.arch, dict(_LAYER_NAMES)
    if arch.qk_norm:
        names.update(_QK_NORM_NAMES)
    if arch.sandwich_norms:
        names.update(_SANDWICH_NORM_NAMES)
    if arch.fused_checkpoint:
        for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                     "mlp.gate_proj.weight", "mlp.up_proj.weight"):
            del names[name]
        names.update(_FUSED_NAMES)
    if arch.experts:
        names.update(_expert_names(config))
    return names


def _expert_names(config: ModelConfig) -> dict[str, str]:
    """A sparse layer's tensor names -> fields: the router, each expert's projections (params.expert_field),
    the shared expert. A dense layer of the same model keeps the dense MLP's names."""
    module = config.arch.experts
    names = {f"{module}.gate.weight": "router"}
    for e in range(config.num_experts):
        names.update({f"{module}.experts.{e}.{proj}.weight": expert_field(e, part)
                      for proj, part in _EXPERT_NAMES[module].items()})
    if config.arch.shared_expert:
        names.update(_SHARED_EXPERT_NAMES)
    return names


def _awq_names(layer_names: dict[str, str]) -> dict[str, str]:
    """A quantized linear's packed weight stands for its dense `weight` (awq.join_linears names it `qweight`)."""
    return {**layer_names, **{name.replace(".weight", ".qweight"): field for name, field in layer_names.items()
                              if awq.is_quantizable(name.rpartition(".")[0])}}


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        files = [_shard_path(model_dir, index, name) for name in sorted(set(_weight_map(index).values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(model_dir, "no *.safetensors weights found (pickle checkpoints such as "
                                 "pytorch_model.bin are refused: unpickling can run arbitrary code)")
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f, f"missing weight shard listed in {INDEX_FILE}")
    return files


def _weight_map(index: Path) -> dict[str, str]:
    """The index's tensor name -> shard file name map."""
    r = FieldReader(read_json(index), index)
    weight_map = r.raw("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise r.error("weight_map", f"must be an object of tensor name -> file name, got {short_repr(weight_map)}")
    return weight_map


def _shard_path(model_dir: Path, index: Path, name: str) -> Path:
    """A shard named by the index: a .safetensors file inside the model directory (a name that climbs out of it
    or is absolute is refused before anything is opened; symbolic links are followed, as in the hub cache)."""
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts or not name.endswith(".safetensors"):
        raise ModelLoadError(index, f"weight_map names {short_repr(name)}: a shard must be a .safetensors file "
                             "inside the model directory")
    return model_dir.joinpath(*parts)


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
        yield field, layer, name, weight if isinstance(weight, WeightFormat) else check_weight(weight, name, path)


def _read_file(path: Path) -> Iterator[tuple[Path, str, np.ndarray]]:
    """(path, name, array) of each tensor in one safetensors file, as host numpy arrays."""
    try:
        with safe_open(str(path), framework="numpy") as f:  # host arrays: no device sees a tensor while loading
            for name in f.keys():
                yield path, name, f.get_tensor(name)
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise ModelLoadError(path, f"cannot read safetensors file (truncated or corrupt?): {e}") from e
