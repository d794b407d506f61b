"""Model configuration: one frozen, hashable dataclass that the jitted forward takes as a static argument."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from jaxllm.architecture import ACTIVATION_NAMES, ARCHITECTURES, SUPPORTED_ARCHITECTURES, Architecture
from jaxllm.errors import ModelLoadError
from jaxllm.file_fields import MAX_INT, FieldReader, short_repr
from jaxllm.moe_config import read_moe_fields
from jaxllm.rope_scaling import Llama3RopeScaling, RopeScaling, read_rope_scaling

__all__ = ["ModelConfig", "Llama3RopeScaling", "SUPPORTED_ARCHITECTURES", "LAYER_TYPES", "merge_token_ids",
           "CacheConfig", "SchedulerConfig", "ParallelConfig", "LoRAConfig"]

LAYER_TYPES = ("full_attention", "sliding_attention")

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    architecture: str  # a family of architecture.ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None  # of the global (full-attention) layers
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    sliding_window: int | None = None  # key j is visible to query p iff p - j < sliding_window (windowed layers)
    layer_types: tuple[str, ...] = ()  # per layer, LAYER_TYPES; () = every layer sliding when a window is set
    rope_local_theta: float | None = None  # Gemma 3: the rope base of the sliding layers (None: rope_theta)
    query_pre_attn_scalar: float | None = None  # Gemma: attention scale query_pre_attn_scalar ** -0.5
    attn_logit_softcap: float | None = None  # Gemma 2: scores -> c * tanh(scores / c)
    final_logit_softcap: float | None = None  # Gemma 2: logits -> c * tanh(logits / c)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # every end-of-sequence id; the first is the primary one
    # mixture of experts (moe_config.py reads them; 0 experts: a dense model)
    num_experts: int = 0  # E routed experts in each sparse layer
    num_experts_per_tok: int = 0  # k: the experts each token runs
    moe_intermediate_size: int = 0  # each expert's MLP width I
    norm_topk_prob: bool = True  # the k routing weights renormalized to sum to 1 (Mixtral always)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert's MLP width (0: none)
    dense_layers: tuple[int, ...] = ()  # layers whose MLP is dense (intermediate_size) in a MoE model
    expert_parallel: bool = False  # experts split whole over the mesh (set by the engine, not read from a file)

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
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"ModelConfig.architecture {self.architecture!r} is unknown; known: "
                             f"{', '.join(ARCHITECTURES)}")
        if self.layer_types and (len(self.layer_types) != self.num_layers
                                 or not set(self.layer_types) <= set(LAYER_TYPES)):
            raise ValueError(f"ModelConfig.layer_types must name {self.num_layers} layers, each one of "
                             f"{', '.join(LAYER_TYPES)}, got {self.layer_types!r}")
        self._check_experts()
        for name in ("sliding_window", "rope_local_theta", "query_pre_attn_scalar", "attn_logit_softcap",
                     "final_logit_softcap"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < math.inf):
                raise ValueError(f"ModelConfig.{name} must be None or a finite number > 0, got {value!r}")

    def _check_experts(self) -> None:
        if self.num_experts == 0:
            return
        if not (isinstance(self.num_experts, int) and self.num_experts > 0 and isinstance(self.num_experts_per_tok, int)
                and 1 <= self.num_experts_per_tok <= self.num_experts):
            raise ValueError(f"ModelConfig.num_experts_per_tok must be in 1..num_experts ({self.num_experts}), got "
                             f"{self.num_experts_per_tok!r}")
        for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (name == "moe_intermediate_size"):
                raise ValueError(f"ModelConfig.{name} must be an int >= 1 in a MoE model, got {value!r}")
        if not all(isinstance(i, int) and 0 <= i < self.num_layers for i in self.dense_layers):
            raise ValueError(f"ModelConfig.dense_layers must be layer indices below {self.num_layers}, got "
                             f"{self.dense_layers!r}")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is routed over experts (else the dense MLP of intermediate_size)."""
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def arch(self) -> Architecture:
        """What this family's forward and checkpoints look like (architecture.py)."""
        return ARCHITECTURES[self.architecture]

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends within sliding_window (else to the whole context)."""
        if self.sliding_window is None:
            return False
        return not self.layer_types or self.layer_types[layer] == "sliding_attention"

    @property
    def attention_scale(self) -> float:
        """The factor on q . k: query_pre_attn_scalar ** -0.5 where the family sets it, else head_dim ** -0.5."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], source: str = "config.json") -> "ModelConfig":
        """Build from a Hugging Face config.json dict; `source` names the file in error messages. Every field is
        checked as it is read (file_fields.FieldReader): a bad one is a ModelLoadError naming it."""
        r = FieldReader(hf, source)
        arch = _architecture(r)
        _reject_unsupported_features(r, ARCHITECTURES[arch])
        num_heads, hidden = r.integer("num_attention_heads"), r.integer("hidden_size")
        head_dim = r.integer("head_dim", hidden // num_heads)
        max_positions = r.integer("max_position_embeddings", 4096)
        num_layers = r.integer("num_hidden_layers")
        theta, scaling, local_theta = _rope(r, arch, head_dim, max_positions)
        window = _sliding_window(r, arch)
        fields = dict(
            architecture=arch,
            vocab_size=r.integer("vocab_size"),
            hidden_size=hidden,
            intermediate_size=r.integer("intermediate_size"),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=r.integer("num_key_value_heads", num_heads),
            head_dim=head_dim,
            rms_norm_eps=r.number("rms_norm_eps", 1e-6, maximum=1.0),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=max_positions,
            tie_word_embeddings=r.flag("tie_word_embeddings", arch in ("gemma2", "gemma3")),
            qkv_bias=ARCHITECTURES[arch].qkv_bias and r.flag("qkv_bias", True),
            sliding_window=window,
            layer_types=() if window is None else _layer_types(r, arch, num_layers),
            rope_local_theta=local_theta,
            bos_token_id=r.integer("bos_token_id", None, minimum=0),
            eos_token_ids=r.token_ids("eos_token_id"),
            **_gemma_fields(r, arch),
            **read_moe_fields(r, ARCHITECTURES[arch], num_layers),
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


def _rope(r: FieldReader, arch: str, head_dim: int, max_positions: int
          ) -> tuple[float, RopeScaling | None, float | None]:
    """(rope_theta, the global layers' scaling, the sliding layers' base or None) from the flat keys (rope_theta,
    rope_scaling, rope_local_base_freq) or rope_parameters, flat or keyed by layer type (newer transformers)."""
    default_theta = 1_000_000.0 if arch == "gemma3" else 10000.0
    original = r.integer("original_max_position_embeddings", None)
    aliases = ("su", "yarn") if arch == "phi3" else ("su",)  # HF's Phi-3 reads "yarn" as longrope
    params = r.section("rope_parameters")
    if params is not None and any(params.has(t) for t in LAYER_TYPES):
        full = params.section("full_attention", None) or FieldReader({}, r.source, "rope_parameters.full_attention.")
        scaling = read_rope_scaling(full, head_dim, max_positions, original, aliases)
        local = params.section("sliding_attention", None)
        if local is not None and read_rope_scaling(local, head_dim, max_positions, original, aliases) is not None:
            raise local.error("rope_type", "other than default on the sliding layers is not supported")
        local_theta = 10000.0 if local is None else local.number("rope_theta", 10000.0)
        return full.number("rope_theta", default_theta), scaling, local_theta if arch == "gemma3" else None
    if r.has("rope_theta"):
        theta = r.number("rope_theta")
    else:
        theta = default_theta if params is None else params.number("rope_theta", default_theta)
    section = r.section("rope_scaling")
    if section is None or not section.values:
        section = params
    scaling = None if section is None or not section.values else \
        read_rope_scaling(section, head_dim, max_positions, original, aliases)
    local_theta = r.number("rope_local_base_freq", 10000.0) if arch == "gemma3" else None
    return theta, scaling, local_theta


def _sliding_window(r: FieldReader, arch: str) -> int | None:
    """The window the family applies (HF Llama has none; Qwen applies its own only with use_sliding_window)."""
    if arch == "llama":
        return None
    if arch in ("qwen2_moe", "qwen3_moe"):
        if r.flag("use_sliding_window", False):
            raise r.error("use_sliding_window", f"is not supported for {arch}")
        return None
    if arch in ("qwen2", "qwen3") and not r.flag("use_sliding_window", False):
        return None
    return r.integer("sliding_window", 4096 if arch in ("gemma2", "gemma3") else None)


def _layer_types(r: FieldReader, arch: str, num_layers: int) -> tuple[str, ...]:
    """Which layers use the window: config.json's layer_types, else the family's rule (HF's defaults)."""
    if r.has("layer_types"):
        types = r.text_list("layer_types")
        if len(types) != num_layers or not set(types) <= set(LAYER_TYPES):
            raise r.error("layer_types", f"must list {num_layers} layers, each one of {', '.join(LAYER_TYPES)}, "
                          f"got {short_repr(types)}")
        return tuple(types)
    if arch in ("qwen2", "qwen3"):  # the layers from max_window_layers on
        first = r.integer("max_window_layers", 28, minimum=0)  # HF's default
        return tuple(LAYER_TYPES[i >= first] for i in range(num_layers))
    if arch in ("gemma2", "gemma3"):  # every pattern-th layer global, the others local
        pattern = 2 if arch == "gemma2" else r.integer("sliding_window_pattern", 6)
        return tuple(LAYER_TYPES[bool((i + 1) % pattern)] for i in range(num_layers))
    return ()


def _gemma_fields(r: FieldReader, arch: str) -> dict:
    """Gemma's attention scale and soft-caps (HF's defaults where the key is absent; null turns a cap off)."""
    if arch not in ("gemma2", "gemma3"):
        return {}
    caps = (50.0, 30.0) if arch == "gemma2" else (None, None)
    return dict(query_pre_attn_scalar=r.number("query_pre_attn_scalar", 256.0),
                attn_logit_softcap=_nullable_number(r, "attn_logit_softcapping", caps[0]),
                final_logit_softcap=_nullable_number(r, "final_logit_softcapping", caps[1]))


def _nullable_number(r: FieldReader, key: str, default: float | None) -> float | None:
    """A positive number; the default when the key is absent, None when it is given as null."""
    if key in r.values and r.values[key] is None:
        return None
    return r.number(key, default)


def _reject_unsupported_features(r: FieldReader, arch: Architecture) -> None:
    key = "hidden_activation" if arch.name in ("gemma2", "gemma3") else "hidden_act"  # what HF's MLP reads
    allowed = ACTIVATION_NAMES[arch.activation]
    act = r.text(key, allowed[0])
    if act not in allowed:
        raise r.error(key, f"{short_repr(act)} is not supported for {arch.name} (supported: {', '.join(allowed)})")
    if r.flag("attention_bias", False) or r.flag("mlp_bias", False):
        raise ModelLoadError(r.source, f"attention_bias/mlp_bias on a {arch.name} model is not supported")
    if r.number("partial_rotary_factor", 1.0, maximum=1.0) != 1.0:
        raise r.error("partial_rotary_factor", "below 1 (rope on part of each head) is not supported")
    if r.flag("use_bidirectional_attention", False):
        raise r.error("use_bidirectional_attention", "is not supported (a decoder attends causally)")


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
    enable_expert_parallel: bool = False  # a MoE model's experts split whole over the mesh (E/N per device)


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Resolved from EngineArgs, which checks the values."""
    max_loras: int = 1  # adapters in device slots at once
    max_lora_rank: int = 16  # the largest rank accepted (every slot is sized for it)
    max_cpu_loras: int = 1  # adapters kept in host memory, >= max_loras
