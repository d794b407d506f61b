"""Every kernel lowers for NVIDIA GPUs through the Triton backend, checked on a CPU-only machine.

`jit(f).trace(...).lower(lowering_platforms=("cuda",))` runs the Pallas -> Triton IR lowering (where unsupported
ops, non-power-of-two block shapes and bad ref indexing fail; tests/cuda_lowering.py); only the Triton -> PTX
compile needs a GPU (or the deviceless compile of tests/gpu_compile).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.paged_attention import ragged_paged_attention, split_kv_paged_attention
from pallas_kernels.paged_attention.testing import random_ragged_case
from tests.cuda_lowering import count_per_step, lower_for_cuda

LLAMA3_8B = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16)
SMOLLM2 = dict(num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", [LLAMA3_8B, SMOLLM2], ids=["llama3_8b", "smollm2"])
def test_ragged_kernel_lowers_to_triton(layout, dtype):
    case = random_ragged_case(0, [(1, 40), (17, 17), (5, 90)], dtype=dtype, pad_seqs=1, pad_tokens=2, **layout)
    fn = functools.partial(ragged_paged_attention, max_query_len=case.max_query_len, sm_scale=0.1)
    text = lower_for_cuda(jax.jit(fn), *case.args())
    assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", [LLAMA3_8B, SMOLLM2], ids=["llama3_8b", "smollm2"])
def test_split_kv_kernel_lowers_to_triton(layout, dtype):
    case = random_ragged_case(0, [(1, 40), (1, 300)], dtype=dtype, pad_seqs=1, **layout)
    fn = functools.partial(split_kv_paged_attention, sm_scale=0.1, num_splits=4)
    text = lower_for_cuda(jax.jit(fn), *case.args())
    assert text.count("__gpu$xla.gpu.triton") == 1


GEMMA2_2B = dict(num_q_heads=8, num_kv_heads=4, head_dim=256, block_size=16)


@pytest.mark.parametrize("options", [{}, dict(sliding_window=37), dict(sliding_window=4096, logit_softcap=50.0)],
                         ids=["plain", "window", "window_softcap"])
@pytest.mark.parametrize("layout", [GEMMA2_2B, SMOLLM2], ids=["gemma2_2b", "smollm2"])
def test_attention_options_lower_to_triton(layout, options):
    """Both kernels with a sliding window and soft-capping, at head sizes 256 and 64 (bfloat16)."""
    case = random_ragged_case(0, [(1, 40), (17, 17), (5, 90)], dtype=jnp.bfloat16, **layout)
    ragged = functools.partial(ragged_paged_attention, max_query_len=case.max_query_len, sm_scale=0.1, **options)
    decode = random_ragged_case(0, [(1, 40), (1, 300)], dtype=jnp.bfloat16, **layout)
    split = functools.partial(split_kv_paged_attention, sm_scale=0.1, num_splits=4, **options)
    for fn, args in ((ragged, case.args()), (split, decode.args())):
        assert lower_for_cuda(jax.jit(fn), *args).count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("num_tokens", [4, 64], ids=["decode_small_m", "prefill_large_m"])
def test_awq_model_step_lowers_with_one_int4_kernel_per_linear(num_tokens):
    """The whole forward of an int4 AWQ model (bf16 activations) lowered for CUDA: each of a layer's four linears
    (q|k|v, o, gate|up, down) becomes a Triton dequant-matmul call, next to attention's."""
    from jaxllm.config import ModelConfig
    from jaxllm.model import Kernels, SequenceChunk, build_step_batch, init_kv_cache, jit_forward
    from jaxllm.model import random_params
    from jaxllm.quantization.rtn_params import rtn_awq_params

    pallas = Kernels(attention="pallas", awq_matmul="pallas")  # trace the kernels, not the CPU paths
    config = ModelConfig(architecture="llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=32)
    dense = random_params(config, jax.random.key(0), jnp.bfloat16)
    chunks = [SequenceChunk(list(range(3, 3 + num_tokens // 2)), 0, [1, 2, 3, 4]),
              SequenceChunk(list(range(3, 3 + num_tokens // 2)), 0, [5, 6, 7, 8])]
    batch = jax.tree.map(jnp.asarray, build_step_batch(chunks, 16))
    cache = init_kv_cache(config, 9, 16, jnp.bfloat16)

    def triton_calls(params) -> int:
        return count_per_step(lower_for_cuda(jit_forward(config, pallas), params, cache, batch),
                              "__gpu$xla.gpu.triton")

    packed = jax.tree.map(jnp.asarray, rtn_awq_params(dense, group_size=32))
    assert triton_calls(packed) == triton_calls(dense) + 4 * config.num_layers


def test_lora_model_step_lowers_with_two_lora_kernels_per_linear():
    """The forward of a model with LoRA slots (bf16) lowered for CUDA: each of a layer's four linears adds the
    shrink and expand Triton kernels to the layer scan's body, next to attention's."""
    from jaxllm.config import ModelConfig
    from jaxllm.lora import device_slots
    from jaxllm.model import Kernels, SequenceChunk, build_step_batch, forward, init_kv_cache, lora_weight
    from jaxllm.model import random_params

    pallas = Kernels(attention="pallas", lora_matmul="pallas")  # trace the kernels, not the CPU paths
    config = ModelConfig(architecture="llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=32)
    params = random_params(config, jax.random.key(0), jnp.bfloat16)
    chunks = [SequenceChunk([3, 4, 5], 0, [1, 2]), SequenceChunk([6], 4, [3, 4])]
    batch = jax.tree.map(jnp.asarray, build_step_batch(chunks, 16, num_tokens=16))
    batch = batch.replace(lora_slots=jnp.asarray([0, 1, 1, 2] + [0] * 12, jnp.int32))
    cache = init_kv_cache(config, 9, 16, jnp.bfloat16)
    slots = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                         jax.eval_shape(lambda: device_slots.init_slots(config, 2, 16, jnp.bfloat16)))

    def step(params, slots, kv, batch):
        return forward(lora_weight.attach(params, slots, batch.lora_slots), kv, batch, config=config,
                       kernels=pallas)

    def plain(params, slots, kv, batch):
        return forward(params, kv, batch, config=config, kernels=pallas)

    def triton_calls(fn) -> int:
        return count_per_step(lower_for_cuda(jax.jit(fn), params, slots, cache, batch), "__gpu$xla.gpu.triton")

    assert triton_calls(step) == triton_calls(plain) + 2 * 4 * config.num_layers  # shrink, expand per linear
