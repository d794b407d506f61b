"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors dequantized to numpy, Q/K rope permutation undone.

The header is read by gguf_file.GGUFFile (numpy over a memory map), the tensors decoded by gguf_dequant. Only the
k-quant types need the `gguf` package (imported then; without it, MissingDependencyError names the package).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from jaxllm.architecture import ARCHITECTURES
from jaxllm.config import LAYER_TYPES, ModelConfig, merge_token_ids
from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import REQUIRED, FieldReader, short_repr
from jaxllm.loaders.assemble import assemble_params, numpy_dtype, tensor_field
from jaxllm.loaders.gguf_dequant import dequantize
from jaxllm.loaders.gguf_experts import (EXPERT_LAYER_NAMES, MOE_ARCHITECTURES, SHARED_EXPERT_NAMES, gguf_family,
                                         gguf_moe_fields, split_experts)
from jaxllm.loaders.gguf_file import GGUFFile
from jaxllm.loaders.host_memory import check_fits_host
from jaxllm.loaders.weight_checks import check_weight
from jaxllm.model.params import NORM_FIELDS, LlamaParams
from jaxllm.optional_deps import MissingDependencyError
from jaxllm.rope_scaling import LinearRopeScaling, LongRopeScaling, RopeScaling, read_rope_scaling

SUPPORTED_TENSOR_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}
# GGUF general.architecture -> jaxllm family (llama.cpp converts Mistral as llama, with its window in the metadata)
SUPPORTED_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                           "gemma3": "gemma3", "phi3": "phi3", **MOE_ARCHITECTURES}  # llama + experts: mixtral

_GLOBAL_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}
_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm", "ffn_norm.weight": "mlp_norm", "attn_q.weight": "wq", "attn_k.weight": "wk",
    "attn_v.weight": "wv", "attn_output.weight": "wo", "attn_q.bias": "bq", "attn_k.bias": "bk",
    "attn_v.bias": "bv", "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down",
}
# what some families add or store otherwise (architecture.py)
_QK_NORM_NAMES = {"attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm"}
_SANDWICH_NORM_NAMES = {"post_attention_norm.weight": "post_attn_norm", "post_ffw_norm.weight": "post_mlp_norm"}
_FUSED_NAMES = {"attn_qkv.weight": "w_qkv", "ffn_up.weight": "w_gate_up"}  # Phi-3: ffn_up holds gate|up rows
_ROPE_FACTOR_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")  # Phi-3's longrope factors
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# The ids that end a generation: end of sequence (the primary one), end of turn, end of message (tool calls).
EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def open_gguf(path: Path) -> GGUFFile:
    """The file's header (memory-mapped); ModelLoadError naming the file when it is missing, short or corrupt.
    A start reads it three times (generation config, weights, tokenizer): the last one opened is reused while
    the file is unchanged."""
    if not path.is_file():
        raise ModelLoadError(path, "GGUF file not found")
    stat = path.stat()
    return _open(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _open(path: Path, size: int, mtime_ns: int) -> GGUFFile:  # size and time: a changed file is read again
    try:
        return GGUFFile(path)
    except (ValueError, OSError) as e:
        raise ModelLoadError(path, f"cannot read GGUF file (truncated or corrupt?): {e}") from e


def gguf_config(reader: GGUFFile, path: Path) -> ModelConfig:
    meta = FieldReader(reader.metadata, path)  # each value checked as it is read
    arch = meta.text("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(path, f"unknown architecture {short_repr(arch)}; supported: "
                             f"{sorted(SUPPORTED_ARCHITECTURES)}")
    moe_family = gguf_family(arch, meta.integer(f"{arch}.expert_count", 0, minimum=0))  # None: a dense model
    experts = {} if moe_family is None else gguf_moe_fields(meta, arch)
    family = moe_family or SUPPORTED_ARCHITECTURES[arch]
    num_heads = meta.integer(f"{arch}.attention.head_count")
    hidden = meta.integer(f"{arch}.embedding_length")
    head_dim = meta.integer(f"{arch}.attention.key_length", hidden // num_heads)
    num_layers = meta.integer(f"{arch}.block_count")
    fields = dict(
        architecture=family,
        vocab_size=_vocab_size(meta, reader, arch),
        hidden_size=hidden,
        intermediate_size=meta.integer(f"{arch}.feed_forward_length", experts.get("moe_intermediate_size", REQUIRED)),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=meta.integer(f"{arch}.attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=meta.number(f"{arch}.attention.layer_norm_rms_epsilon", maximum=1.0),
        rope_theta=meta.number(f"{arch}.rope.freq_base", 1_000_000.0 if arch == "gemma3" else 10000.0),
        rope_scaling=gguf_rope_scaling(meta, reader, arch, head_dim),
        max_position_embeddings=meta.integer(f"{arch}.context_length", 4096),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        qkv_bias=ARCHITECTURES[family].qkv_bias,
        **gguf_window(meta, arch, num_layers),
        **_gemma_fields(meta, arch, head_dim),
        bos_token_id=meta.integer("tokenizer.ggml.bos_token_id", None, minimum=0),
        eos_token_ids=merge_token_ids(*(meta.integer(key, None, minimum=0) for key in EOS_KEYS)),
        **experts,
    )
    try:
        return ModelConfig(**fields)
    except ValueError as e:
        raise ModelLoadError(path, f"inconsistent metadata: {e}") from e


def gguf_rope_scaling(meta: FieldReader, reader: GGUFFile, arch: str, head_dim: int) -> RopeScaling | None:
    """{arch}.rope.scaling.*: none, linear, or Phi-3's longrope (its factors are the rope_factors_* tensors);
    other types are refused, naming the key."""
    kind = meta.text(f"{arch}.rope.scaling.type", "none")
    factor_tensors = {t.name: t for t in reader.tensors if t.name in _ROPE_FACTOR_TENSORS}
    if kind == "linear":
        return LinearRopeScaling(factor=meta.number(f"{arch}.rope.scaling.factor"))
    if factor_tensors or kind == "longrope":
        return _gguf_longrope(meta, factor_tensors, arch, head_dim)
    if kind != "none":
        raise meta.error(f"{arch}.rope.scaling.type", f"{short_repr(kind)} is not supported in GGUF files "
                         "(supported: none, linear, and Phi-3's longrope factor tensors)")
    return None


def _gguf_longrope(meta: FieldReader, tensors: dict, arch: str, head_dim: int) -> LongRopeScaling:
    if arch != "phi3" or set(tensors) != set(_ROPE_FACTOR_TENSORS):
        raise ModelLoadError(meta.source, f"longrope needs both {' and '.join(_ROPE_FACTOR_TENSORS)} on a phi3 "
                             f"model (this {arch} file has {sorted(tensors) or 'neither'})")
    factors = {}
    for name, key in zip(_ROPE_FACTOR_TENSORS, ("short_factor", "long_factor")):
        values = dequantize(tensors[name].data, tensors[name].type_name).reshape(-1)
        factors[key] = check_weight(values, name, meta.source).tolist()
    original = meta.integer(f"{arch}.rope.scaling.original_context_length")
    section = FieldReader({"rope_type": "longrope", **factors, "original_max_position_embeddings": original,
                           "attention_factor": meta.number(f"{arch}.rope.scaling.attn_factor", None)},
                          meta.source, f"{arch}.rope.scaling.")
    return read_rope_scaling(section, head_dim, meta.integer(f"{arch}.context_length", 4096))


def gguf_window(meta: FieldReader, arch: str, num_layers: int) -> dict:
    """sliding_window and layer_types: {arch}.attention.sliding_window, and which layers use it from
    {arch}.attention.sliding_window_pattern (every n-th layer global, or a flag per layer) or llama.cpp's
    rule for the family (Gemma 2: every 2nd layer global; Gemma 3: every 6th; others: all layers)."""
    window = meta.integer(f"{arch}.attention.sliding_window", None)
    if window is None:
        return {}
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = meta.raw(key, {"gemma2": 2, "gemma3": 6}.get(arch))
    if pattern is None:
        return dict(sliding_window=window)
    if hasattr(pattern, "tolist"):
        pattern = pattern.tolist()
    if isinstance(pattern, list):
        if len(pattern) != num_layers or not all(isinstance(v, bool) for v in pattern):
            raise meta.error(key, f"must be {num_layers} flags (one per layer), got {short_repr(pattern)}")
        return dict(sliding_window=window, layer_types=tuple(LAYER_TYPES[v] for v in pattern))
    every = meta.integer(key, {"gemma2": 2, "gemma3": 6}.get(arch))
    return dict(sliding_window=window,
                layer_types=tuple(LAYER_TYPES[bool((i + 1) % every)] for i in range(num_layers)))


def _gemma_fields(meta: FieldReader, arch: str, head_dim: int) -> dict:
    """The attention scale ({arch}.attention.scale, else head_dim ** -0.5: llama.cpp's rule except for the 27B
    models, whose files should carry the scale), the sliding layers' rope base and the soft-caps."""
    if arch not in ("gemma2", "gemma3"):
        return {}
    scale = meta.number(f"{arch}.attention.scale", None)
    caps = (50.0, 30.0) if arch == "gemma2" else (None, None)
    fields = dict(query_pre_attn_scalar=float(head_dim) if scale is None else scale ** -2,
                  attn_logit_softcap=meta.number(f"{arch}.attn_logit_softcapping", caps[0]),
                  final_logit_softcap=meta.number(f"{arch}.final_logit_softcapping", caps[1]))
    if arch == "gemma3":
        fields["rope_local_theta"] = meta.number(f"{arch}.rope.freq_base_swa", 10000.0)
    return fields


def gguf_layer_names(config: ModelConfig) -> dict[str, str]:
    """A layer's GGUF tensor names (after blk.N.) -> params fields, for the config's family."""
    arch, names = config.arch, dict(_LAYER_NAMES)
    if arch.qk_norm:
        names.update(_QK_NORM_NAMES)
    if arch.sandwich_norms:
        names.update(_SANDWICH_NORM_NAMES)
    if arch.fused_checkpoint:
        for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight", "ffn_up.weight"):
            del names[name]
        names.update(_FUSED_NAMES)
    if arch.experts:
        names.update(EXPERT_LAYER_NAMES)
    if arch.shared_expert:
        names.update(SHARED_EXPERT_NAMES)
    return names


def load_gguf(path: Path, dtype: str = "float32", as_tiles: bool = False) -> tuple[ModelConfig, LlamaParams]:
    """The config and host (numpy) params, dequantized and cast to dtype tensor by tensor (as_tiles:
    assemble_params')."""
    reader = open_gguf(path)
    config = gguf_config(reader, path)
    check_fits_host(config, path, np.dtype(numpy_dtype(dtype)).itemsize)
    return config, assemble_params(config, _tensors(reader, config, path), source=str(path), dtype=dtype,
                                   as_tiles=as_tiles)


def _tensors(reader: GGUFFile, config: ModelConfig, path: Path) -> Iterator[tuple[str, int | None, str, np.ndarray]]:
    permute_qk = config.architecture in ("llama", "mixtral")  # llama.cpp reorders Q/K rows only for its llama
    layer_names = gguf_layer_names(config)
    for tensor in reader.tensors:
        field, layer = tensor_field(tensor.name, _GLOBAL_NAMES, _LAYER_RE, layer_names)
        if field is None and tensor.name in _ROPE_FACTOR_TENSORS and config.architecture == "phi3":
            continue  # read into the config (gguf_rope_scaling)
        if field is None:
            if tensor.name == "rope_freqs.weight":
                raise ModelLoadError(path, "rope_freqs.weight (GGUF rope frequency factors) is not supported")
            raise ModelLoadError(path, f"unexpected tensor {short_repr(tensor.name)}")
        if tensor.type_name not in SUPPORTED_TENSOR_TYPES:
            raise ModelLoadError(path, f"tensor {tensor.name!r} has unsupported GGUF type {tensor.type_name}; "
                                 f"supported: {', '.join(sorted(SUPPORTED_TENSOR_TYPES))}")
        try:
            array = dequantize(tensor.data, tensor.type_name)
        except MissingDependencyError:
            raise
        except Exception as e:
            raise ModelLoadError(path, f"cannot dequantize tensor {tensor.name!r}: {e}") from e
        check_weight(array, tensor.name, path)
        if config.arch.norm_offset and (field in NORM_FIELDS or field == "final_norm"):
            array = array - np.float32(config.arch.norm_offset)  # llama.cpp stores Gemma's norms as (1 + w)
        if permute_qk and field in ("wq", "bq"):
            array = unpermute_rope_rows(array, config.num_heads)
        elif permute_qk and field in ("wk", "bk"):
            array = unpermute_rope_rows(array, config.num_kv_heads)
        for part_field, name, part in split_experts(field, array, tensor.name):  # a stacked [E, ...] per expert
            yield part_field, layer, name, part


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order.

    Within each head, llama.cpp interleaves the two rotary halves (rows 0, D/2, 1, D/2+1, ...) for its
    adjacent-pair rope; Hugging Face keeps the halves apart. Rows [H*D, ...] -> same shape, halves restored.
    """
    rows = w.shape[0]
    head_dim = rows // num_heads
    split = w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:])  # [H, D/2, 2, ...] pairs as stored
    return split.swapaxes(1, 2).reshape(w.shape)  # [H, 2, D/2, ...]: first halves, then second halves


def _vocab_size(meta: FieldReader, reader: GGUFFile, arch: str) -> int:
    if meta.has(f"{arch}.vocab_size"):
        return meta.integer(f"{arch}.vocab_size")
    tokens = reader.metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ModelLoadError(meta.source, f"GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    return len(tokens)
