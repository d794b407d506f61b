"""EngineArgs: the user-facing knobs (vLLM's names), resolved against the loaded model into configs."""

from __future__ import annotations

import dataclasses
import logging

import jax

from jaxllm.config import CacheConfig, SchedulerConfig
from jaxllm.model.kv_cache import kv_cache_bytes
from jaxllm.model.params import param_bytes, params_dtype

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30
ACTIVATION_RESERVE_FRACTION = 0.1  # of the GPU memory budget, kept for activations and XLA workspace


@dataclasses.dataclass
class EngineArgs:
    model: str | None = None  # None: the default model
    dtype: str = "auto"
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_gpu_blocks: int | None = None  # explicit pool size in blocks (overrides the memory budget)
    gpu_memory_utilization: float = 0.9  # GPU: fraction of device memory for params + KV cache + activations
    kv_cache_memory_bytes: int | None = None  # explicit KV cache size (CPU default: min(2 GiB, what is needed))
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"
    seed: int = 0
    attention: str = "auto"  # "auto" | "reference" | "pallas"
    warmup: bool = False  # build every step program before serving (then no workload compiles anything)
    async_scheduling: bool = True  # dispatch step t + 1 before waiting for step t (outputs unchanged)
    compilation_cache_dir: str | None = None  # persistent XLA compilation cache: programs survive restarts
    skip_tokenizer: bool = False

    def __post_init__(self):
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2, got {self.num_gpu_blocks}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")

    def enable_compilation_cache(self) -> None:
        if self.compilation_cache_dir is not None:
            jax.config.update("jax_compilation_cache_dir", self.compilation_cache_dir)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    def resolve(self, loaded) -> tuple[SchedulerConfig, CacheConfig]:
        config = loaded.config
        max_model_len = self.max_model_len or config.max_position_embeddings
        if max_model_len > config.max_position_embeddings:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                             f"{config.max_position_embeddings}")
        if config.sliding_window is not None and max_model_len > config.sliding_window:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's sliding_window "
                             f"{config.sliding_window}, which jaxllm does not implement yet")
        scheduler = SchedulerConfig(max_num_seqs=self.max_num_seqs,
                                    max_num_batched_tokens=self.max_num_batched_tokens,
                                    max_model_len=max_model_len, enable_chunked_prefill=self.enable_chunked_prefill,
                                    policy=self.scheduling_policy)
        cache = CacheConfig(block_size=self.block_size, num_blocks=self._num_blocks(loaded, max_model_len),
                            enable_prefix_caching=self.enable_prefix_caching)
        logger.info("KV cache: %d blocks of %d tokens", cache.num_blocks, cache.block_size)
        return scheduler, cache

    def _num_blocks(self, loaded, max_model_len: int) -> int:
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        per_block = kv_cache_bytes(loaded.config, 1, self.block_size, params_dtype(loaded.params))
        if self.kv_cache_memory_bytes is not None:
            budget = self.kv_cache_memory_bytes
        elif jax.default_backend() == "gpu":
            budget = self._gpu_budget(loaded)
        else:
            needed = per_block * (1 + self.max_num_seqs * -(-max_model_len // self.block_size))
            budget = min(DEFAULT_CPU_KV_CACHE_BYTES, needed)
        num_blocks = budget // per_block
        if num_blocks < 2:
            raise ValueError(f"the KV cache budget of {budget} bytes holds {num_blocks} blocks of {per_block} bytes; "
                             f"at least 2 are needed")
        return int(num_blocks)

    def _gpu_budget(self, loaded) -> int:
        stats = jax.devices()[0].memory_stats() or {}
        total = stats.get("bytes_limit")
        if total is None:
            raise ValueError("cannot read the GPU's memory size; pass num_gpu_blocks or kv_cache_memory_bytes")
        usable = total * self.gpu_memory_utilization
        return int(usable * (1 - ACTIVATION_RESERVE_FRACTION) - param_bytes(loaded.params))
