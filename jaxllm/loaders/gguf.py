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

from jaxllm.config import ModelConfig, merge_token_ids
from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import FieldReader, short_repr
from jaxllm.loaders.assemble import assemble_params, numpy_dtype, tensor_field
from jaxllm.loaders.gguf_dequant import dequantize
from jaxllm.loaders.gguf_file import GGUFFile
from jaxllm.loaders.host_memory import check_fits_host
from jaxllm.loaders.weight_checks import check_weight
from jaxllm.model.params import LlamaParams
from jaxllm.optional_deps import MissingDependencyError

SUPPORTED_TENSOR_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
SUPPORTED_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}  # GGUF general.architecture -> jaxllm family

_GLOBAL_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}
_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm", "ffn_norm.weight": "mlp_norm", "attn_q.weight": "wq", "attn_k.weight": "wk",
    "attn_v.weight": "wv", "attn_output.weight": "wo", "attn_q.bias": "bq", "attn_k.bias": "bk",
    "attn_v.bias": "bv", "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down",
}
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
    scaling = meta.text(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ModelLoadError(path, f"GGUF rope scaling type {short_repr(scaling)} is not supported")
    num_heads = meta.integer(f"{arch}.attention.head_count")
    hidden = meta.integer(f"{arch}.embedding_length")
    fields = dict(
        architecture=SUPPORTED_ARCHITECTURES[arch],
        vocab_size=_vocab_size(meta, reader, arch),
        hidden_size=hidden,
        intermediate_size=meta.integer(f"{arch}.feed_forward_length"),
        num_layers=meta.integer(f"{arch}.block_count"),
        num_heads=num_heads,
        num_kv_heads=meta.integer(f"{arch}.attention.head_count_kv", num_heads),
        head_dim=meta.integer(f"{arch}.attention.key_length", hidden // num_heads),
        rms_norm_eps=meta.number(f"{arch}.attention.layer_norm_rms_epsilon", maximum=1.0),
        rope_theta=meta.number(f"{arch}.rope.freq_base", 10000.0),
        max_position_embeddings=meta.integer(f"{arch}.context_length", 4096),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        qkv_bias=arch == "qwen2",
        bos_token_id=meta.integer("tokenizer.ggml.bos_token_id", None, minimum=0),
        eos_token_ids=merge_token_ids(*(meta.integer(key, None, minimum=0) for key in EOS_KEYS)),
    )
    try:
        return ModelConfig(**fields)
    except ValueError as e:
        raise ModelLoadError(path, f"inconsistent metadata: {e}") from e


def load_gguf(path: Path, dtype: str = "float32") -> tuple[ModelConfig, LlamaParams]:
    """The config and host (numpy) params, dequantized and cast to dtype tensor by tensor."""
    reader = open_gguf(path)
    config = gguf_config(reader, path)
    check_fits_host(config, path, np.dtype(numpy_dtype(dtype)).itemsize)
    return config, assemble_params(config, _tensors(reader, config, path), source=str(path), dtype=dtype)


def _tensors(reader: GGUFFile, config: ModelConfig, path: Path) -> Iterator[tuple[str, int | None, str, np.ndarray]]:
    permute_qk = config.architecture == "llama"  # llama.cpp's converter reorders Q/K rows only for this one
    for tensor in reader.tensors:
        field, layer = tensor_field(tensor.name, _GLOBAL_NAMES, _LAYER_RE, _LAYER_NAMES)
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
        if permute_qk and field in ("wq", "bq"):
            array = unpermute_rope_rows(array, config.num_heads)
        elif permute_qk and field in ("wk", "bk"):
            array = unpermute_rope_rows(array, config.num_kv_heads)
        yield field, layer, tensor.name, array


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
