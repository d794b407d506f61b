"""The Llama-family model: parameters, KV block pool, step batch and the pure forward."""

from jaxllm.model.kernels import Kernels, select_kernels
from jaxllm.model.kv_cache import KVCache
from jaxllm.model.llama import compute_logits
from jaxllm.model.params import LlamaParams, LayerParams, random_params
from jaxllm.model.step_batch import SequenceChunk, StepBatch, build_step_batch
from jaxllm.model.tensor_parallel import forward, forward_hidden, init_kv_cache, jit_forward

__all__ = ["Kernels", "select_kernels", "KVCache", "init_kv_cache", "compute_logits", "forward", "forward_hidden",
           "jit_forward", "LlamaParams", "LayerParams", "random_params", "SequenceChunk", "StepBatch",
           "build_step_batch"]
