"""Every kernel lowers for NVIDIA GPUs through the Triton backend, checked on a CPU-only machine.

`jit(f).trace(...).lower(lowering_platforms=("cuda",))` runs the Pallas -> Triton IR lowering (where unsupported
ops, non-power-of-two block shapes and bad ref indexing fail); only the Triton -> PTX compile needs a GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.paged_attention import ragged_paged_attention, split_kv_paged_attention
from pallas_kernels.paged_attention.testing import random_ragged_case

LLAMA3_8B = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16)
SMOLLM2 = dict(num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16)


def lower_for_cuda(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", [LLAMA3_8B, SMOLLM2], ids=["llama3_8b", "smollm2"])
def test_ragged_kernel_lowers_to_triton(layout, dtype):
    case = random_ragged_case(0, [(1, 40), (17, 17), (5, 90)], dtype=dtype, pad_seqs=1, pad_tokens=2, **layout)
    fn = functools.partial(ragged_paged_attention, max_query_len=case.max_query_len, sm_scale=0.1)
    text = lower_for_cuda(fn, *case.args())
    assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", [LLAMA3_8B, SMOLLM2], ids=["llama3_8b", "smollm2"])
def test_split_kv_kernel_lowers_to_triton(layout, dtype):
    case = random_ragged_case(0, [(1, 40), (1, 300)], dtype=dtype, pad_seqs=1, **layout)
    fn = functools.partial(split_kv_paged_attention, sm_scale=0.1, num_splits=4)
    text = lower_for_cuda(fn, *case.args())
    assert text.count("__gpu$xla.gpu.triton") == 1
