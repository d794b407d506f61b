"""Multi-LoRA delta: the Pallas kernels (interpret mode) against the jnp reference, every output element written,
exact zeros for base-model tokens, the knobs, and the CUDA (Triton) lowering at Llama-3-8B shapes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.lora import lora_delta, lora_delta_reference
from pallas_kernels.lora.kernel import Tiles, default_split_k, lora_expand_into, lora_shrink_into
from pallas_kernels.lora.testing import TOLERANCE, random_case, relative_error
from tests.cuda_lowering import lower_for_cuda

BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32

# (id, T, K, N, R, S, slots, x dtype, weight dtype, knobs): K and N off the tiles, R = 48 padded to 64, T over 1..512
KERNEL_CASES = [
    ("t1_bf16_r16_s1", 1, 200, 72, 16, 1, [1], BF16, None, {}),
    ("t1_f32_r48_s4_slot3", 1, 136, 40, 48, 4, [3], F32, None, {}),
    ("t3_f16_r8_s4_interleaved", 3, 136, 40, 8, 4, [3, 0, 1], F16, None, dict(block_k=32, split_k=3)),
    ("t17_bf16_r48_s4_runs", 17, 300, 100, 48, 4, "runs", BF16, None, {}),
    ("t17_bf16_x_f32_weights", 17, 100, 24, 16, 4, "interleaved", BF16, F32, {}),
    ("t64_f32_r16_s4_interleaved", 64, 96, 200, 16, 4, "interleaved", F32, None, dict(block_m=32, block_n=64)),
    ("t130_f16_r48_s4_runs_small_tiles", 130, 160, 136, 48, 4, "runs", F16, None,
     dict(block_m=32, block_n=64, block_k=32, split_k=2, num_warps=8, num_stages=3)),
    ("t130_bf16_r8_s1_interleaved", 130, 72, 40, 8, 1, "interleaved", BF16, None, {}),
    ("t512_bf16_r16_s4_runs", 512, 64, 48, 16, 4, "runs", BF16, None, dict(block_n=64)),
]


@pytest.mark.parametrize("case_id,t,k,n,r,s,slots,dtype,weight_dtype,knobs", KERNEL_CASES,
                         ids=[c[0] for c in KERNEL_CASES])
def test_kernel_matches_reference(case_id, t, k, n, r, s, slots, dtype, weight_dtype, knobs):
    case = random_case(len(case_id), t, k, n, r, s, slots, dtype, weight_dtype)
    y = np.asarray(jax.jit(functools.partial(lora_delta, interpret=True, **knobs))(*case.args()))
    expected = np.asarray(lora_delta_reference(*case.args()))
    assert y.shape == (t, n) and y.dtype == np.float32
    assert not np.isnan(y).any()
    assert relative_error(y, expected) < TOLERANCE[jnp.dtype(dtype)]
    base = np.asarray(case.token_slots) == 0
    assert np.all(y[base] == 0), "a base-model token got a delta"


def test_kernels_write_every_element():
    """Into NaN-filled buffers: every partial and every output element is written, padding lanes never leak.

    Two token tiles (the second mostly padding), K = 200 in three splits of three 32-deep steps (the last split
    one part step), R = 48 padded to 64, N = 40 in three 16-column tiles (the last a part tile)."""
    t, k, n, r, splits = 20, 200, 40, 48, 3
    case = random_case(7, t, k, n, r, 4, [0, 2, 2, 1, 4, 0, 3, 3, 3, 1, 1, 0, 2, 4, 4, 4, 0, 1, 3, 2], BF16)
    shrink = jax.jit(functools.partial(lora_shrink_into, block_m=16, block_k=32, interpret=True))
    partials = np.asarray(shrink(jnp.full((splits, t, r), jnp.nan, jnp.float32), case.x, case.a, case.token_slots))
    assert not np.isnan(partials).any(), "a partial was not written"
    own = np.array(jnp.einsum("tk,trk->tr", case.x, case.a[jnp.maximum(case.token_slots - 1, 0)],
                                preferred_element_type=jnp.float32))  # [T, R]
    own[np.asarray(case.token_slots) == 0] = 0
    np.testing.assert_allclose(partials.sum(axis=0), own, rtol=1e-5, atol=1e-5 * np.abs(own).max())

    expand = jax.jit(functools.partial(lora_expand_into, block_m=16, block_n=16, interpret=True))
    y = np.asarray(expand(jnp.full((t, n), jnp.nan, jnp.float32), jnp.asarray(partials), case.b, case.token_slots))
    assert not np.isnan(y).any(), "an output element was not written"
    assert relative_error(y, lora_delta_reference(*case.args())) < TOLERANCE[jnp.dtype(BF16)]


def test_base_tokens_give_exact_zeros_and_are_never_read():
    """All tokens on slot 0: exact zeros. Base tokens' rows of x (slot 0, or outside 1..S as the reference treats
    them) hold NaN: they come out 0, the others as the reference (each slot's x loads are masked to its tokens)."""
    case = random_case(3, 17, 136, 40, 16, 2, "runs", BF16)
    delta = jax.jit(functools.partial(lora_delta, interpret=True, block_k=64))
    zeros = case._replace(x=jnp.full_like(case.x, jnp.nan), token_slots=jnp.zeros_like(case.token_slots))
    assert np.array_equal(np.asarray(delta(*zeros.args())), np.zeros((17, 40), np.float32))

    slots = jnp.asarray([0, 1, 1, 0, 2, 2, 2, 3, -1, 1, 2, 0, 1, 1, 0, 2, 0], jnp.int32)
    base = (np.asarray(slots) < 1) | (np.asarray(slots) > 2)
    x = jnp.where(jnp.asarray(base)[:, None], jnp.nan, case.x)
    poisoned = case._replace(x=x, token_slots=slots)
    y = np.asarray(delta(*poisoned.args()))
    assert not np.isnan(y).any() and np.all(y[base] == 0)
    assert relative_error(y, lora_delta_reference(*poisoned.args())) < TOLERANCE[jnp.dtype(BF16)]


def test_knobs_and_shapes_are_checked():
    case = random_case(0, 3, 64, 24, 16, 2, "interleaved", F32)
    with pytest.raises(TypeError, match="block_q"):
        lora_delta(*case.args(), interpret=True, block_q=16)
    with pytest.raises(ValueError, match="block_n"):
        lora_delta(*case.args(), interpret=True, block_n=48)
    with pytest.raises(ValueError, match="block_k"):
        lora_delta(*case.args(), interpret=True, block_k=8)
    with pytest.raises(ValueError, match="mismatched"):
        lora_delta(case.x, case.a, case.b[:, :, :8], case.token_slots, interpret=True)
    assert lora_delta(case.x[:0], case.a, case.b, case.token_slots[:0], interpret=True).shape == (0, 24)


@pytest.mark.parametrize("t,k,r,expected", [
    (1, 4096, 48, 16),  # one token tile wants 132 splits; 4 KiB of partials each, 64 KiB at most
    (1, 14336, 16, 64),  # rank 16: 1 KiB of partials per split
    (256, 4096, 48, 4),  # four 64-token tiles want 33 splits; 16 KiB of partials each caps them at 4
    (1, 200, 16, 2),  # two BK steps of K
])
def test_default_split_k(t, k, r, expected):
    assert default_split_k(t, k, r, Tiles.choose(t, r)) == expected


# ---------------------------------------------------------------------------------------------- CUDA lowering


@pytest.mark.parametrize("t", [1, 64, 512], ids=["t1", "t64", "t512"])
@pytest.mark.parametrize("k,n,r,dtype", [
    (4096, 6144, 48, BF16),  # q|k|v, three fused rank-16 parts
    (4096, 4096, 16, F16),  # o
    (4096, 28672, 32, BF16),  # gate|up, two fused rank-16 parts
    (14336, 4096, 16, BF16),  # down
    (4096, 6144, 48, F32),
], ids=["qkv_bf16", "o_f16", "gate_up_bf16", "down_bf16", "qkv_f32"])
def test_kernel_lowers_to_triton_at_llama3_8b_shapes(t, k, n, r, dtype):
    args = (jax.ShapeDtypeStruct((t, k), dtype), jax.ShapeDtypeStruct((4, r, k), dtype),
            jax.ShapeDtypeStruct((4, n, r), dtype), jax.ShapeDtypeStruct((t,), jnp.int32))
    text = lower_for_cuda(jax.jit(lora_delta), *args)
    assert text.count("__gpu$xla.gpu.triton") == 2  # the shrink and the expand
