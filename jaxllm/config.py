"""Model configuration: one frozen, hashable dataclass that the jitted forward takes as a static argument."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import MAX_INT, FieldReader, short_repr

# Hugging Face `architectures[0]` -> the family name used inside jaxllm.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent rope scaling (rope_scaling.rope_type == "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "llama" | "mistral" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    sliding_window: int | None = None  # recorded, not applied: contexts must stay within it
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # every end-of-sequence id; the first is the primary one

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"ModelConfig.{name} must be a finite number > 0, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_INT for t in self.eos_token_ids):
            raise ValueError(f"ModelConfig.eos_token_ids must be token ids >= 0, got {self.eos_token_ids!r}")

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], source: str = "config.json") -> "ModelConfig":
        """Build from a Hugging Face config.json dict; `source` names the file in error messages. Every field is
        checked as it is read (file_fields.FieldReader): a bad one is a ModelLoadError naming it."""
        r = FieldReader(hf, source)
        arch = _architecture(r)
        _reject_unsupported_features(r)
        num_heads, hidden = r.integer("num_attention_heads"), r.integer("hidden_size")
        fields = dict(
            architecture=arch,
            vocab_size=r.integer("vocab_size"),
            hidden_size=hidden,
            intermediate_size=r.integer("intermediate_size"),
            num_layers=r.integer("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=r.integer("num_key_value_heads", num_heads),
            head_dim=r.integer("head_dim", hidden // num_heads),
            rms_norm_eps=r.number("rms_norm_eps", 1e-6, maximum=1.0),
            rope_theta=_rope_theta(r),
            rope_scaling=_rope_scaling(r),
            max_position_embeddings=r.integer("max_position_embeddings", 4096),
            tie_word_embeddings=r.flag("tie_word_embeddings", False),
            qkv_bias=arch == "qwen2",
            sliding_window=_sliding_window(r, arch),
            bos_token_id=r.integer("bos_token_id", None, minimum=0),
            eos_token_ids=r.token_ids("eos_token_id"),
        )
        try:
            return cls(**fields)
        except ValueError as e:
            raise ModelLoadError(source, str(e)) from e


def merge_token_ids(*values: int | list[int] | tuple[int, ...] | None) -> tuple[int, ...]:
    """The ids named by each value (an id, a list of ids, or None), in order of first appearance, without repeats."""
    ids: list[int] = []
    for value in values:
        for token_id in [] if value is None else value if isinstance(value, (list, tuple)) else [value]:
            if token_id not in ids:  # by equality: a value read from a file may be unhashable (ModelConfig refuses it)
                ids.append(token_id)
    return tuple(ids)


def _architecture(r: FieldReader) -> str:
    archs = r.text_list("architectures")
    arch = SUPPORTED_ARCHITECTURES.get(archs[0]) if archs else None
    if arch is None:
        named = archs or r.raw("model_type", None)
        raise ModelLoadError(r.source, f"unknown architecture {short_repr(named)}; "
                             f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    return arch


def _rope_theta(r: FieldReader) -> float:
    if r.has("rope_theta"):
        return r.number("rope_theta")
    params = r.section("rope_parameters")  # newer transformers nest it here
    return 10000.0 if params is None else params.number("rope_theta", 10000.0)


def _rope_scaling(r: FieldReader) -> Llama3RopeScaling | None:
    scaling = r.section("rope_scaling")
    if scaling is None or not scaling.values:
        scaling = r.section("rope_parameters")
    if scaling is None or not scaling.values:
        return None
    kind = scaling.text("rope_type", None) or scaling.text("type", "default")
    if kind == "default":
        return None
    if kind != "llama3":
        raise scaling.error("rope_type", f"{short_repr(kind)} is not supported (supported: default, llama3)")
    return llama3_rope_scaling(scaling)


def llama3_rope_scaling(scaling: FieldReader) -> Llama3RopeScaling:
    """Llama3RopeScaling's fields from a config section (the same keys in config.json and a jaxllm checkpoint)."""
    low = scaling.number("low_freq_factor")
    high = scaling.number("high_freq_factor")
    if high <= low:
        raise scaling.error("high_freq_factor", f"must be above low_freq_factor ({low}), got {high}")
    return Llama3RopeScaling(factor=scaling.number("factor"), low_freq_factor=low, high_freq_factor=high,
                             original_max_position_embeddings=scaling.integer("original_max_position_embeddings"))


def _sliding_window(r: FieldReader, arch: str) -> int | None:
    if arch == "qwen2" and not r.flag("use_sliding_window", False):
        return None
    return r.integer("sliding_window", None)


def _reject_unsupported_features(r: FieldReader) -> None:
    act = r.text("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(r.source, f"hidden_act {short_repr(act)} is not supported (only 'silu')")
    if r.flag("attention_bias", False) or r.flag("mlp_bias", False):
        raise ModelLoadError(r.source, "attention_bias/mlp_bias on a Llama-family model is not supported")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    num_blocks: int = 0  # blocks in the pool, including the null block 0
    enable_prefix_caching: bool = True

    def __post_init__(self):
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {self.num_blocks}")


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences per step
    max_num_batched_tokens: int = 512  # tokens per step (the token budget)
    max_model_len: int = 2048  # prompt + output tokens of one sequence
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"  # "fcfs" | "priority" (lower priority value first, then arrival)

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens}) must "
                             f"be >= max_model_len ({self.max_model_len}) so every prompt fits in one step")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Resolved from EngineArgs, which checks the values."""
    tensor_parallel_size: int = 1  # devices the model is split over: the mesh's size (1: a mesh of one device)
    num_processes: int = 1  # processes running the model together (the mesh then spans all their devices)


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Resolved from EngineArgs, which checks the values."""
    max_loras: int = 1  # adapters in device slots at once
    max_lora_rank: int = 16  # the largest rank accepted (every slot is sized for it)
    max_cpu_loras: int = 1  # adapters kept in host memory, >= max_loras
