"""config.json and generation_config.json of the quantized checkpoint.

A Hugging Face source keeps its own config.json (every field other AWQ loaders may read stays as it was); a GGUF
or orbax source gets one written from its ModelConfig. Either way `quantization_config` says how the weights are
stored, in the keys AutoAWQ, transformers and vLLM read, and torch_dtype is float16, the dtype of the scales and
of every unquantized tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxllm.config import ModelConfig
from jaxllm.loaders.resolve import ModelSource

_HF_CLASSES = {"llama": ("LlamaForCausalLM", "llama"), "mistral": ("MistralForCausalLM", "mistral"),
               "qwen2": ("Qwen2ForCausalLM", "qwen2")}


def awq_config(source: ModelSource, config: ModelConfig, group_size: int) -> dict:
    """The source's HF config with the AWQ quantization_config added."""
    hf = _read_json(source.path / "config.json") if source.kind == "hf_dir" else hf_config_from(config)
    hf["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                                 "version": "gemm", "modules_to_not_convert": None}
    hf["torch_dtype"] = "float16"
    if "dtype" in hf:  # newer transformers write this key instead
        hf["dtype"] = "float16"
    return hf


def hf_config_from(config: ModelConfig) -> dict:
    """An HF config.json dict for a model known only by its ModelConfig (GGUF, orbax)."""
    architecture, model_type = _HF_CLASSES[config.architecture]
    hf = {
        "architectures": [architecture], "model_type": model_type, "hidden_act": "silu",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids[0] if config.eos_token_ids else None,
    }
    if config.rope_scaling is not None:
        hf["rope_scaling"] = {"rope_type": "llama3", **vars(config.rope_scaling)}
    if config.architecture == "qwen2":
        hf["use_sliding_window"] = False
    if config.sliding_window is not None:
        hf["sliding_window"] = config.sliding_window
    return hf


def generation_config(source: ModelSource, config: ModelConfig) -> dict | None:
    """The source's generation_config.json, or one naming every EOS id the model has (GGUF sources list end of
    turn and end of message ids there too); None when it has none."""
    if source.kind == "hf_dir" and (source.path / "generation_config.json").is_file():
        return _read_json(source.path / "generation_config.json")
    if not config.eos_token_ids:
        return None
    eos = list(config.eos_token_ids)
    generation = {"eos_token_id": eos[0] if len(eos) == 1 else eos}
    if config.bos_token_id is not None:
        generation["bos_token_id"] = config.bos_token_id
    return generation


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())
