"""The AWQ checkpoint directory: model.safetensors, config.json, generation_config.json and the tokenizer.

The tensors: HF Llama names, linears as qweight/qzeros/scales, everything else fp16.

    model.embed_tokens.weight                               fp16 [V, H]
    model.layers.{i}.input_layernorm.weight                 fp16 [H]        (AWQ's 1/s folded in)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.qweight       int32 [K, N/8]  (awq_format.py)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.qzeros        int32 [K/G, N/8]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.scales        fp16 [K/G, N]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias            fp16 [N]        (Qwen2)
    model.layers.{i}.post_attention_layernorm.weight        fp16 [H]
    model.layers.{i}.self_attn.{q,k}_norm.weight            fp16 [D]        (Qwen3, Gemma 3)
    model.layers.{i}.{pre,post}_feedforward_layernorm.weight fp16 [H]       (Gemma 2/3: the MLP's norm is pre_,
                                                                            post_attention_ the attention's post-norm)
    model.layers.{i}.mlp.{gate,up,down}_proj.{qweight,qzeros,scales}
    model.norm.weight                                       fp16 [H]
    lm_head.weight                                          fp16 [V, H]     (untied models only)

config.json: a Hugging Face source keeps its own (every field other AWQ loaders may read stays as it was); a GGUF
or orbax source gets one written from its ModelConfig. Either way `quantization_config` says how the weights are
stored, in the keys AutoAWQ, transformers and vLLM read, and torch_dtype is float16, the dtype of the scales and
of every unquantized tensor.

read_dequantized reads one back into float32 weights (the HF [N, K] layout, dense_forward.py names) with the
format's own unpacker: what the perplexity checks and tests run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxllm.config import ModelConfig
from jaxllm.loaders.resolve import ModelSource
from jaxllm.loaders.safetensors import layer_tensor_names
from jaxllm.quantization.awq_format import dequantize_awq, pack_awq

WEIGHTS_FILE = "model.safetensors"
GLOBAL_NAMES = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight"}
LINEAR_NAMES = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
                "w_down": "mlp.down_proj"}
DENSE_LAYER_NAMES = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
                     "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias"}


def dense_layer_names(config: ModelConfig) -> dict[str, str]:
    """Each unquantized layer field (norms, biases) -> its HF tensor name after model.layers.N., for the config's
    family: the names the loader reads, so what is written loads back."""
    linears = {f"{name}.weight" for name in LINEAR_NAMES.values()}
    return {field: name for name, field in layer_tensor_names(config).items() if name not in linears}


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def layer_tensors(layer: int, dense: dict, quantized: dict,
                  dense_names: dict[str, str] = DENSE_LAYER_NAMES) -> dict[str, np.ndarray]:
    """One layer's checkpoint tensors. dense: norms and biases, named by dense_names (dense_layer_names); quantized:
    linear -> (codes [N, K], zero points [N, K/G], scales [N, K/G]) in the HF orientation, transposed here to
    AWQ's [K, ...]."""
    prefix = layer_prefix(layer)
    tensors = {prefix + dense_names[name]: fp16(value, prefix + dense_names[name]) for name, value in dense.items()}
    for name, (q, zeros, scales) in quantized.items():
        base = prefix + LINEAR_NAMES[name]
        qweight, qzeros, scales16 = pack_awq(np.asarray(q).T, np.asarray(zeros).T, np.asarray(scales).T)
        tensors.update({base + ".qweight": qweight, base + ".qzeros": qzeros,
                        base + ".scales": fp16(scales16, base + ".scales")})
    return tensors


def global_tensors(weights: dict) -> dict[str, np.ndarray]:
    return {GLOBAL_NAMES[name]: fp16(value, GLOBAL_NAMES[name]) for name, value in weights.items()}


def fp16(value, name: str) -> np.ndarray:
    """value as float16, refusing values beyond its range rather than writing inf."""
    array = np.asarray(value).astype(np.float16)
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: values beyond float16's range ({np.abs(np.asarray(value)).max():.3g}); this "
                         f"model cannot be stored as an fp16 AWQ checkpoint")
    return array


def write_checkpoint(output_dir: Path, tensors: dict[str, np.ndarray], source: ModelSource, config: ModelConfig,
                     group_size: int, tokenizer) -> None:
    """model.safetensors, config.json, generation_config.json (when the model has EOS ids), the tokenizer files.
    Each tensor is made C-contiguous first (safetensors' numpy writer copies a transposed array's memory as it
    lies, silently storing the transpose)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    tensors = {name: np.ascontiguousarray(array) for name, array in tensors.items()}
    save_file(tensors, str(output_dir / WEIGHTS_FILE), metadata={"format": "pt"})  # "pt": what transformers expects
    (output_dir / "config.json").write_text(json.dumps(awq_config(source, config, group_size), indent=2) + "\n")
    generation = generation_config(source, config)
    if generation is not None:
        (output_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(str(output_dir))


def read_dequantized(directory: Path) -> tuple[dict, dict, list[dict]]:
    """A written checkpoint -> (its config.json dict, global weights, per-layer weights), all float32, linears
    dequantized to the HF [N, K] layout."""
    hf = _read_json(directory / "config.json")
    dense_names = dense_layer_names(ModelConfig.from_hf_config(hf, source=str(directory / "config.json")))
    group_size = hf["quantization_config"]["group_size"]
    with safe_open(str(directory / WEIGHTS_FILE), framework="numpy") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    glob = {field: tensors[name].astype(np.float32) for field, name in GLOBAL_NAMES.items() if name in tensors}
    layers = []
    for i in range(hf["num_hidden_layers"]):
        prefix = layer_prefix(i)
        layer = {field: tensors[prefix + name].astype(np.float32)
                 for field, name in dense_names.items() if prefix + name in tensors}
        for field, name in LINEAR_NAMES.items():
            parts = [tensors[f"{prefix}{name}.{part}"] for part in ("qweight", "qzeros", "scales")]
            layer[field] = dequantize_awq(*parts, group_size).T  # [N, K]
        layers.append(layer)
    return hf, glob, layers


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
