"""AutoAWQ "GEMM" checkpoints: quantization_config read and checked, each linear's three tensors joined into one
AWQWeight.

config.json (transformers' AwqConfig keys; AutoAWQ's older w_bit / q_group_size are read too):

    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
                            "version": "gemm", "modules_to_not_convert": null}

A quantized linear `P` (P = model.layers.{i}.self_attn.q_proj, ...; in a mixture-of-experts model also each
expert's projections, model.layers.{i}.block_sparse_moe.experts.{e}.w1/w2/w3 (Mixtral) or
model.layers.{i}.mlp.experts.{e}.gate_proj/up_proj/down_proj (Qwen2-MoE, Qwen3-MoE), and Qwen2-MoE's
mlp.shared_expert.*_proj) is stored as P.qweight int32 [K, N/8], P.qzeros int32 [K/G, N/8] and P.scales fp16
[K/G, N] (pallas_kernels/awq_matmul/layout.py for the packing); a linear whose name contains an entry of
modules_to_not_convert is stored dense as P.weight, as are the embedding, the norms, the biases and the LM head.
The router (mlp.gate / block_sparse_moe.gate) and Qwen2-MoE's shared_expert_gate are always dense, as AutoAWQ and
vLLM keep them (AutoAWQ's Mixtral lists "gate" in modules_to_not_convert): they are not linears this module joins.
Whether an expert's projection is quantized is asked of its experts module (model.layers.{i}.mlp.experts), as vLLM
asks it of the fused MoE layer. `join_linears` turns the three tensors of each quantized linear into one AWQWeight
named P.qweight (repacked to the kernel layout, host numpy), checking every tensor's dtype and shape; the ordinary
loader then maps the names to fields and checks each weight's [N, K] against the config (assemble stacks an MoE
layer's experts into [E, ...] AWQWeights). The scales are cast to the activations' dtype when that is bfloat16 or
float16 (`scale_dtype`): the kernel then dequantizes int4 straight into it, with no float32 round trip
(pallas_kernels/awq_matmul/README.md).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from jaxllm.errors import ModelLoadError
from jaxllm.loaders.weight_checks import check_weight
from jaxllm.model.awq_weight import AWQWeight
from pallas_kernels.awq_matmul import repack, with_scale_dtype

QUANTIZATION_METHODS = ("awq",)  # what `quantization=` / --quantization accept
LINEAR_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",  # the linears AutoAWQ quantizes in a Llama
                  "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                  "mlp.shared_expert.down_proj")  # Qwen2-MoE's shared expert
EXPERT_LINEAR = re.compile(r"(block_sparse_moe|mlp)\.experts\.\d+\.(w1|w2|w3|gate_proj|up_proj|down_proj)")
_LAYER_MODULE = re.compile(r"model\.layers\.\d+\.(.+)")
PARTS = ("qweight", "qzeros", "scales")
PACKED_BYTES_PER_PARAM = 0.5  # int4: the least host memory an AWQ checkpoint's parameters can take


@dataclasses.dataclass(frozen=True)
class AWQConfig:
    group_size: int
    modules_to_not_convert: tuple[str, ...] = ()

    def converted(self, module: str) -> bool:
        """Whether the linear named `module` is stored quantized (vLLM's rule: no listed name is a substring; an
        expert's projection is asked as its experts module, model.layers.{i}.mlp.experts)."""
        owner = module.partition(".experts.")[0] + ".experts" if ".experts." in module else module
        return not any(skip in owner for skip in self.modules_to_not_convert)


def check_quantization_name(quantization: str | None) -> None:
    if quantization is not None and quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} (or unset), "
                         f"got {quantization!r}")


def read_awq_config(hf: dict, path: Path, requested: str | None) -> AWQConfig | None:
    """The checkpoint's AWQ settings from its config.json dict (None: not quantized); ModelLoadError naming the
    key when the checkpoint is quantized in a way jaxllm cannot read, or is not what `requested` asked for."""
    check_quantization_name(requested)
    config = hf.get("quantization_config")
    if config is None:
        if requested is not None:
            raise ModelLoadError(path, f"quantization={requested!r} was asked for, but there is no "
                                 "quantization_config: this is not an AutoAWQ checkpoint")
        return None
    if not isinstance(config, dict):
        raise ModelLoadError(path, f"quantization_config must be an object, got {config!r}")
    method = str(config.get("quant_method", "")).lower()
    if method not in QUANTIZATION_METHODS:
        raise ModelLoadError(path, f"quantization_config.quant_method {config.get('quant_method')!r} is not "
                             f"supported (jaxllm reads: {', '.join(QUANTIZATION_METHODS)})")
    bits = _key(config, "bits", "w_bit")
    if bits != 4:
        raise ModelLoadError(path, f"quantization_config.bits is {bits!r}: only 4-bit AWQ weights are supported")
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise ModelLoadError(path, f"quantization_config.version {config.get('version')!r} is not supported: "
                             "only AutoAWQ's GEMM layout is read (GEMV and other layouts pack differently; "
                             "re-quantize with version 'gemm' or `jaxllm quantize`)")
    if config.get("zero_point", True) is not True:
        raise ModelLoadError(path, "quantization_config.zero_point must be true: AWQ GEMM weights carry zero points")
    group_size = _key(config, "group_size", "q_group_size")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0 or group_size % 8:
        raise ModelLoadError(path, f"quantization_config.group_size must be a positive multiple of 8, got "
                             f"{group_size!r}")
    skip = config.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        raise ModelLoadError(path, f"quantization_config.modules_to_not_convert must be a list of module names, "
                             f"got {skip!r}")
    return AWQConfig(group_size=group_size, modules_to_not_convert=tuple(skip))


def _key(config: dict, name: str, old_name: str) -> Any:
    return config[name] if name in config else config.get(old_name)


def check_expert_groups(config, awq: AWQConfig, path: Path) -> None:
    """ModelLoadError naming the config key when the group size does not divide a mixture-of-experts model's expert
    input width (gate/up: hidden_size; down: moe_intermediate_size; Qwen2-MoE's shared expert:
    shared_expert_intermediate_size): no int4 expert of such a checkpoint can hold whole groups."""
    widths = {"hidden_size": config.hidden_size, "moe_intermediate_size": config.moe_intermediate_size,
              "shared_expert_intermediate_size": config.shared_expert_intermediate_size}
    for key, width in widths.items():
        if config.num_experts and width % awq.group_size:
            raise ModelLoadError(path, f"quantization_config.group_size {awq.group_size} does not divide {key} "
                                 f"{width}: an int4 expert's input rows must split into whole groups")


def scale_dtype(activation_dtype) -> np.dtype | None:
    """The dtype a model's AWQ scales are held in: its activations' when 16-bit (the kernel's fast path: a
    checkpoint's fp16 scales rounded once to bf16 move by at most 2^-9 of themselves), else the checkpoint's own
    (None: float32 activations dequantize in float32 whatever the scales)."""
    dtype = np.dtype(activation_dtype)
    return dtype if dtype.itemsize == 2 else None


def join_linears(named: Iterable[tuple[Path, str, np.ndarray]], awq: AWQConfig, activation_dtype=np.float32
                 ) -> Iterator[tuple[Path, str, Any]]:
    """(file, tensor name, array) as read -> the same, with each quantized linear's qweight, qzeros and scales
    joined into one AWQWeight named `P.qweight`. ModelLoadError naming the file and tensor for a part that is
    missing, of the wrong dtype or shape, a quantized linear that modules_to_not_convert lists, or a dense linear
    that it does not."""
    pending: dict[str, dict[str, tuple[Path, np.ndarray]]] = {}
    for path, name, array in named:
        module, _, part = name.rpartition(".")
        if not _is_linear(module):
            yield path, name, array
        elif part == "weight":
            if awq.converted(module):
                raise ModelLoadError(path, f"tensor {name!r} is a dense weight in an AWQ checkpoint, but "
                                     "quantization_config.modules_to_not_convert does not name this module")
            yield path, name, array
        elif part in PARTS:
            if not awq.converted(module):
                raise ModelLoadError(path, f"tensor {name!r} is quantized, but quantization_config."
                                     f"modules_to_not_convert lists this module (expected {module}.weight)")
            parts = pending.setdefault(module, {})
            parts[part] = (path, array)
            if len(parts) == len(PARTS):
                weight = _weight(module, pending.pop(module), awq.group_size, scale_dtype(activation_dtype))
                yield path, f"{module}.qweight", weight
        else:
            yield path, name, array  # the ordinary loader names it as unexpected
    for module, parts in pending.items():
        missing = [p for p in PARTS if p not in parts]
        path = next(iter(parts.values()))[0]
        raise ModelLoadError(path, f"AWQ linear {module!r} has no {' or '.join(missing)} tensor "
                             f"(a quantized linear needs {', '.join(PARTS)})")


def _is_linear(module: str) -> bool:
    m = _LAYER_MODULE.fullmatch(module)
    return m is not None and is_quantizable(m.group(1))


def is_quantizable(layer_module: str) -> bool:
    """Whether a layer's module (the name after model.layers.{i}.) is a linear an AWQ checkpoint may quantize."""
    return layer_module in LINEAR_MODULES or EXPERT_LINEAR.fullmatch(layer_module) is not None


def _weight(module: str, parts: dict[str, tuple[Path, np.ndarray]], group_size: int, scales_as) -> AWQWeight:
    """One linear's checked tensors -> AWQWeight (numpy leaves, the kernel layout)."""
    (qw_path, qweight), (qz_path, qzeros), (s_path, scales) = (parts[p] for p in PARTS)
    for path, part, array in ((qw_path, "qweight", qweight), (qz_path, "qzeros", qzeros)):
        if array.dtype != np.int32:
            raise ModelLoadError(path, f"tensor '{module}.{part}' is {array.dtype}, AWQ packs int4 into int32")
    check_weight(scales, f"{module}.scales", s_path)
    if qweight.ndim != 2 or qweight.shape[0] % group_size:
        raise ModelLoadError(qw_path, f"tensor '{module}.qweight' has shape {qweight.shape}: expected "
                             f"[K, N/8] with K a multiple of the group size {group_size}")
    k, n = qweight.shape[0], 8 * qweight.shape[1]
    expected = {"qzeros": (qz_path, qzeros, (k // group_size, n // 8)),
                "scales": (s_path, scales, (k // group_size, n))}
    for part, (path, array, shape) in expected.items():
        if tuple(array.shape) != shape:
            raise ModelLoadError(path, f"tensor '{module}.{part}' has shape {tuple(array.shape)}, but qweight "
                                 f"{tuple(qweight.shape)} with group size {group_size} implies {shape}")
    packed = repack(qweight, qzeros, scales, group_size)
    return AWQWeight.from_packed(packed if scales_as is None else with_scale_dtype(packed, scales_as))
