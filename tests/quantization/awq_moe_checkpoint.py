"""AutoAWQ-layout checkpoints of the tiny mixture-of-experts models, written here (jaxllm's quantizer does not write
int4 experts): every 2-D layer weight but the router and Qwen2-MoE's shared_expert_gate is RTN int4 as
qweight/qzeros/scales, as AutoAWQ stores them; beside it a float32 Hugging Face directory of the same model with those
linears dequantized (what the AWQ model must compute)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxllm.quantization.awq_format import dequantize_awq, pack_awq
from jaxllm.quantization.group_quant import quantize_groups

ROUTERS = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.shared_expert_gate.weight")  # kept dense


def quantized(name: str, array: np.ndarray) -> bool:
    """Whether AutoAWQ stores this tensor as int4: a layer's 2-D weight that is not a router."""
    return name.startswith("model.layers.") and array.ndim == 2 and not name.endswith(ROUTERS)


def rtn_awq(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [N, K] -> AutoAWQ's (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales fp16 [K/G, N]), C-contiguous
    (safetensors' numpy writer stores a transposed array's memory as it lies)."""
    q, zeros, scales = (np.asarray(a) for a in quantize_groups(jnp.asarray(w, jnp.float32), group_size))
    return tuple(np.ascontiguousarray(a) for a in pack_awq(q.T, zeros.T, scales.T))


def write_awq_moe(source: Path, awq_dir: Path, dense_dir: Path, group_size: int,
                  modules_to_not_convert: list[str] | None = None) -> tuple[Path, Path]:
    """source: a tiny HF MoE directory -> (awq_dir, dense_dir) as the module docstring says."""
    with safe_open(str(source / "model.safetensors"), framework="numpy") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    awq, dense = {}, {}
    for name, array in tensors.items():
        if not quantized(name, array):
            awq[name] = dense[name] = array
            continue
        module = name.removesuffix(".weight")
        qweight, qzeros, scales = rtn_awq(array, group_size)
        awq.update({f"{module}.qweight": qweight, f"{module}.qzeros": qzeros, f"{module}.scales": scales})
        dense[name] = np.ascontiguousarray(dequantize_awq(qweight, qzeros, scales, group_size).T)  # [N, K] f32
    hf = json.loads((source / "config.json").read_text())
    quantization = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                    "version": "gemm", "modules_to_not_convert": modules_to_not_convert}
    for directory, weights, config in ((awq_dir, awq, {**hf, "quantization_config": quantization}),
                                       (dense_dir, dense, hf)):
        shutil.copytree(source, directory, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
        (directory / "config.json").write_text(json.dumps(config))
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return awq_dir, dense_dir
