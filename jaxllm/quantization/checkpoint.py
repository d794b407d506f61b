"""The AWQ checkpoint's tensors: HF Llama names, linears as qweight/qzeros/scales, everything else fp16.

    model.embed_tokens.weight                               fp16 [V, H]
    model.layers.{i}.input_layernorm.weight                 fp16 [H]        (AWQ's 1/s folded in)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.qweight       int32 [K, N/8]  (awq_format.py)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.qzeros        int32 [K/G, N/8]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.scales        fp16 [K/G, N]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias            fp16 [N]        (Qwen2)
    model.layers.{i}.post_attention_layernorm.weight        fp16 [H]
    model.layers.{i}.mlp.{gate,up,down}_proj.{qweight,qzeros,scales}
    model.norm.weight                                       fp16 [H]
    lm_head.weight                                          fp16 [V, H]     (untied models only)

read_dequantized reads one back into float32 weights (the HF [N, K] layout, dense_forward.py names) with the
format's own unpacker: what the perplexity checks and tests run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxllm.quantization.awq_format import dequantize_awq, pack_awq

WEIGHTS_FILE = "model.safetensors"
GLOBAL_NAMES = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight"}
LINEAR_NAMES = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
                "w_down": "mlp.down_proj"}
DENSE_LAYER_NAMES = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
                     "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias"}


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def layer_tensors(layer: int, dense: dict, quantized: dict) -> dict[str, np.ndarray]:
    """One layer's checkpoint tensors. dense: norms and biases; quantized: linear -> (codes [N, K], zero points
    [N, K/G], scales [N, K/G]) in the HF orientation, transposed here to AWQ's [K, ...]."""
    prefix = layer_prefix(layer)
    tensors = {prefix + DENSE_LAYER_NAMES[name]: fp16(value, prefix + DENSE_LAYER_NAMES[name])
               for name, value in dense.items()}
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


def write_tensors(directory: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Write the tensors; each is made C-contiguous first (safetensors' numpy writer copies a transposed array's
    memory as it lies, silently storing the transpose)."""
    path = directory / WEIGHTS_FILE
    tensors = {name: np.ascontiguousarray(array) for name, array in tensors.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})  # "pt": what transformers expects of the metadata
    return path


def read_dequantized(directory: Path) -> tuple[dict, dict, list[dict]]:
    """A written checkpoint -> (its config.json dict, global weights, per-layer weights), all float32, linears
    dequantized to the HF [N, K] layout."""
    hf = json.loads((directory / "config.json").read_text())
    group_size = hf["quantization_config"]["group_size"]
    with safe_open(str(directory / WEIGHTS_FILE), framework="numpy") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    glob = {field: tensors[name].astype(np.float32) for field, name in GLOBAL_NAMES.items() if name in tensors}
    layers = []
    for i in range(hf["num_hidden_layers"]):
        prefix = layer_prefix(i)
        layer = {field: tensors[prefix + name].astype(np.float32)
                 for field, name in DENSE_LAYER_NAMES.items() if prefix + name in tensors}
        for field, name in LINEAR_NAMES.items():
            parts = [tensors[f"{prefix}{name}.{part}"] for part in ("qweight", "qzeros", "scales")]
            layer[field] = dequantize_awq(*parts, group_size).T  # [N, K]
        layers.append(layer)
    return hf, glob, layers
