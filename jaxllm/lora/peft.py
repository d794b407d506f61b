"""Reading a PEFT LoRA adapter directory into the host arrays the device slots hold.

    adapter_config.json          r, lora_alpha, use_rslora, target_modules, ...
    adapter_model.safetensors    base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight
                                 module: q/k/v/o_proj, gate/up/down_proj (Phi-3: qkv_proj, o_proj,
                                 gate_up_proj, down_proj, its checkpoints' fused linears)
                                 A [r, in], B [out, r] per targeted module and layer

The engine's linears are fused (q|k|v -> w_qkv, gate|up -> w_gate_up), so an adapter becomes, per LayerParams
linear field, two arrays over all layers, with R = max_lora_rank and P the field's parts (3, 2 or 1):

    a  [L, P*R, K]    part p's A in rank rows p*R .. p*R + r (zero rows pad its rank r up to R)
    b  [L, N, P*R]    part p's B, times the scaling (alpha / r, or alpha / sqrt(r) with rsLoRA), in its own
                      output rows and rank columns p*R ..: block-diagonal, so that b @ (a @ x) gives every part
                      only its own delta

A module the adapter does not target (or a layer it skips) is all zeros. Pickled adapters (adapter_model.bin) are
refused without being opened; so are DoRA, modules_to_save, bias training, ranks above max_lora_rank, unknown
modules and shapes that do not match the base model, each with an error naming the file and the problem.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import FieldReader, read_json, short_repr
from jaxllm.loaders.weight_checks import all_finite, check_weight

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLED_FILES = ("adapter_model.bin", "adapter_model.pt", "adapter_model.pth")

# PEFT module name -> (LayerParams field, part index within the fused field)
MODULES = {"q_proj": ("w_qkv", 0), "k_proj": ("w_qkv", 1), "v_proj": ("w_qkv", 2), "o_proj": ("wo", 0),
           "gate_proj": ("w_gate_up", 0), "up_proj": ("w_gate_up", 1), "down_proj": ("w_down", 0)}
FIELD_PARTS = {"w_qkv": ("q_proj", "k_proj", "v_proj"), "wo": ("o_proj",), "w_gate_up": ("gate_proj", "up_proj"),
               "w_down": ("down_proj",)}
# Phi-3's checkpoints fuse q|k|v and gate|up into one linear each, so its adapters target those (one part each)
FUSED_FIELD_PARTS = {"w_qkv": ("qkv_proj",), "wo": ("o_proj",), "w_gate_up": ("gate_up_proj",),
                     "w_down": ("down_proj",)}


def field_parts(config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Per LayerParams linear field, the PEFT modules it fuses, in row order (the family's module names)."""
    return FUSED_FIELD_PARTS if config.arch.fused_checkpoint else FIELD_PARTS


def modules(config: ModelConfig) -> dict[str, tuple[str, int]]:
    """PEFT module name -> (LayerParams field, part index within the fused field), for the config's family."""
    return {module: (field, p) for field, parts in field_parts(config).items() for p, module in enumerate(parts)}
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# config keys that must be unset (falsy): features whose weights this engine does not apply
_UNSUPPORTED = {"use_dora": "DoRA (use_dora)", "modules_to_save": "modules_to_save (fully trained modules)",
                "fan_in_fan_out": "fan_in_fan_out", "lora_bias": "LoRA biases (lora_bias)",
                "layer_replication": "layer_replication", "alpha_pattern": "alpha_pattern",
                "trainable_token_indices": "trainable_token_indices", "use_qalora": "QALoRA (use_qalora)",
                "alora_invocation_tokens": "aLoRA (alora_invocation_tokens)"}

HostAdapter = dict  # LayerParams field -> (a [L, P*R, K], b [L, N, P*R]) numpy arrays


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of each PEFT-targetable module of one layer."""
    h, f = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q), "gate_proj": (f, h),
            "up_proj": (f, h), "down_proj": (h, f), "qkv_proj": (q + 2 * kv, h), "gate_up_proj": (2 * f, h)}


def field_shapes(config: ModelConfig, max_rank: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per LayerParams linear field: the shapes of its (a, b) arrays, [L, P*R, K] and [L, N, P*R]."""
    shapes, layers = {}, config.num_layers
    for field, parts in field_parts(config).items():
        outs = [module_shapes(config)[m][0] for m in parts]
        k = module_shapes(config)[parts[0]][1]
        shapes[field] = ((layers, len(parts) * max_rank, k), (layers, sum(outs), len(parts) * max_rank))
    return shapes


def read_adapter_config(path: str, known_modules=MODULES) -> dict:
    """adapter_config.json, checked (file_fields.FieldReader): a LoRA adapter using only what the engine applies.
    Refusals are ModelLoadErrors (ValueErrors) naming the file and the key."""
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter {path!r} is not a directory (a PEFT adapter directory is needed)")
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ValueError(f"LoRA adapter {path!r} has no {CONFIG_FILE}")
    try:
        config = read_json(config_path)
    except ModelLoadError as e:
        raise ModelLoadError(config_path, f"not readable JSON ({e.problem})") from e
    r = FieldReader(config, config_path)
    r.text("peft_type", "LORA", choices=("LORA",))
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise ModelLoadError(config_path, f"{what} is not supported ({key} = {short_repr(config[key])})")
    bias = r.text("bias", "none")
    if bias != "none":
        raise ModelLoadError(config_path, f"bias = {short_repr(bias)} is not supported (only 'none')")
    r.number("r")  # the tensors' shapes give each module's rank
    r.number("lora_alpha")
    r.flag("use_rslora", False)
    _check_targets(r, known_modules)
    return config


def _check_targets(r: FieldReader, known_modules) -> None:
    """target_modules: a list of supported module names, or a string (PEFT's pattern: the tensors say which)."""
    targets = r.raw("target_modules", None)
    if isinstance(targets, list):
        unknown = [m for m in r.text_list("target_modules") if m not in known_modules]
        if unknown:
            raise r.error("target_modules", f"{short_repr(unknown)} are not supported (supported: "
                          f"{', '.join(known_modules)})")
    elif targets is not None and not isinstance(targets, str):
        raise r.error("target_modules", f"must be a list of module names or a pattern, got {short_repr(targets)}")


def load_peft_adapter(path: str, config: ModelConfig, max_rank: int, dtype) -> HostAdapter:
    """The adapter at `path` as host arrays per linear field (see the module docstring), in `dtype`."""
    adapter_config = read_adapter_config(path, modules(config))
    weights_path = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(weights_path):
        pickled = [name for name in PICKLED_FILES if os.path.isfile(os.path.join(path, name))]
        if pickled:
            raise ValueError(f"{os.path.join(path, pickled[0])}: pickled adapter weights are refused (loading "
                             f"them runs code); save the adapter as {WEIGHTS_FILE}")
        raise ValueError(f"LoRA adapter {path!r} has no {WEIGHTS_FILE}")
    found = _read_modules(weights_path, config)
    return _fuse(found, adapter_config, config, max_rank, dtype, weights_path)


def _read_modules(weights_path: str, config: ModelConfig) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """(layer, module) -> {"A": [r, in], "B": [out, r]}, every tensor name and shape checked."""
    from safetensors import safe_open

    shapes, known = module_shapes(config), modules(config)
    found: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    try:
        with safe_open(weights_path, framework="numpy") as f:
            for name in f.keys():
                match = _KEY.match(name)
                if match is None or match.group(2) not in known:
                    raise ValueError(f"{weights_path}: tensor {name!r} is not a LoRA A/B weight of a supported "
                                     f"module ({', '.join(known)})")
                layer, module, which = int(match.group(1)), match.group(2), match.group(3)
                if layer >= config.num_layers:
                    raise ValueError(f"{weights_path}: tensor {name!r} is for layer {layer}, but the base model "
                                     f"has {config.num_layers} layers")
                found.setdefault((layer, module), {})[which] = _checked(f.get_tensor(name), name, which,
                                                                          shapes[module], weights_path)
    except ValueError:
        raise
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"{weights_path}: not a readable safetensors file ({e})") from e
    for (layer, module), pair in found.items():
        if set(pair) != {"A", "B"}:
            missing = ({"A", "B"} - set(pair)).pop()
            raise ValueError(f"{weights_path}: layer {layer} {module} has no lora_{missing} tensor")
        if pair["A"].shape[0] != pair["B"].shape[1]:
            raise ValueError(f"{weights_path}: layer {layer} {module}: lora_A has rank {pair['A'].shape[0]} but "
                             f"lora_B has rank {pair['B'].shape[1]}")
    if not found:
        raise ValueError(f"{weights_path}: holds no LoRA weights")
    return found


def _checked(tensor: np.ndarray, name: str, which: str, out_in: tuple[int, int], weights_path: str) -> np.ndarray:
    out, k = out_in
    if tensor.ndim != 2 or (which == "A" and tensor.shape[1] != k) or (which == "B" and tensor.shape[0] != out):
        expected = f"[r, {k}]" if which == "A" else f"[{out}, r]"
        raise ValueError(f"{weights_path}: tensor {name!r} has shape {list(tensor.shape)}; the base model needs "
                         f"{expected}")
    rank = tensor.shape[0 if which == "A" else 1]
    if rank == 0:
        raise ModelLoadError(weights_path, f"tensor {name!r} has rank 0 (shape {list(tensor.shape)}): a LoRA "
                             "module needs rank >= 1")
    return np.asarray(check_weight(tensor, name, weights_path), np.float32)


def _fuse(found, adapter_config: dict, config: ModelConfig, max_rank: int, dtype, weights_path: str) -> HostAdapter:
    alpha, rslora = float(adapter_config["lora_alpha"]), bool(adapter_config.get("use_rslora"))
    shapes = field_shapes(config, max_rank)
    out_sizes = {m: s[0] for m, s in module_shapes(config).items()}
    adapter = {}
    for field, parts in field_parts(config).items():
        a = np.zeros(shapes[field][0], np.float32)  # [L, P*R, K]
        b = np.zeros(shapes[field][1], np.float32)  # [L, N, P*R]
        row = 0
        for p, module in enumerate(parts):
            for layer in range(config.num_layers):
                pair = found.get((layer, module))
                if pair is None:
                    continue
                rank = pair["A"].shape[0]
                if rank > max_rank:
                    raise ValueError(f"{weights_path}: layer {layer} {module} has rank {rank}, above max_lora_rank "
                                     f"{max_rank}")
                scaling = alpha / (math.sqrt(rank) if rslora else rank)
                a[layer, p * max_rank:p * max_rank + rank] = pair["A"]
                b[layer, row:row + out_sizes[module], p * max_rank:p * max_rank + rank] = pair["B"] * scaling
            row += out_sizes[module]
        adapter[field] = (a.astype(dtype), _scaled_b(b, dtype, alpha, field, weights_path))
    return adapter


def _scaled_b(b: np.ndarray, dtype, alpha: float, field: str, weights_path: str) -> np.ndarray:
    """b (scaling folded in) in `dtype`; ModelLoadError naming the config when the scaling overflows it."""
    b = b.astype(dtype)
    if not all_finite(b):
        raise ModelLoadError(os.path.join(os.path.dirname(weights_path), CONFIG_FILE),
                             f"lora_alpha {alpha:g} scales the {field} lora_B weights beyond the range of "
                             f"{np.dtype(dtype).name}")
    return b
