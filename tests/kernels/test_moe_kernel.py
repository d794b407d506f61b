"""The Pallas (Triton) MoE kernels (pallas_kernels/moe/kernel.py) in interpret mode against the jnp oracle, and
the cost estimate each launch carries."""

import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.moe import moe_experts, moe_experts_reference
from pallas_kernels.moe.kernel import moe_experts_pallas, pallas_block_m
from pallas_kernels.moe.layout import num_tiles
from pallas_kernels.moe.testing import TOLERANCE, random_case, relative_error
from tests.cuda_lowering import lower_for_cuda

H, INTER = 32, 48  # INTER is not a multiple of block_n: the last column tile is masked
KNOBS = dict(block_n=32, block_k=16)
CASES = [  # (T, k, E, routing, block_m or None)
    (1, 1, 1, "uniform", None), (1, 8, 64, "uniform", None), (9, 2, 8, "uniform", None),
    (16, 2, 8, "one", 16), (24, 8, 64, "skewed", None), (17, 2, 8, "out_of_range", 16), (40, 2, 8, "uniform", 32),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("num_tokens, top_k, num_experts, routing, block_m", CASES)
def test_pallas_matches_the_reference(num_tokens, top_k, num_experts, routing, block_m, dtype):
    case = random_case(num_tokens, num_tokens, top_k, num_experts, H, INTER, dtype, routing)
    run = functools.partial(moe_experts_pallas, interpret=True, block_m=block_m, **KNOBS)
    got = jax.jit(run)(*case)
    want = moe_experts_reference(*case)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert relative_error(got, want) <= TOLERANCE[jnp.dtype(dtype)]


def test_dispatch_runs_the_kernel_with_gelu():
    case = random_case(5, 6, 2, 4, H, 64, jnp.float32)
    got = moe_experts(*case, activation="gelu_tanh", implementation="pallas", interpret=True)
    assert relative_error(got, moe_experts_reference(*case, activation="gelu_tanh")) <= 1e-5


def test_each_launch_carries_the_padded_routed_flops():
    """gate_up: 2 * P * H * 2I flops, down: 2 * P * I * H, P = the static padded row capacity (layout.py)."""
    num_tokens, top_k, num_experts, hidden, inter = 256, 8, 128, 2048, 768
    s = jax.ShapeDtypeStruct
    args = (s((num_tokens, hidden), jnp.bfloat16), s((num_tokens, top_k), jnp.int32),
            s((num_tokens, top_k), jnp.float32), s((num_experts, 2 * inter, hidden), jnp.bfloat16),
            s((num_experts, hidden, inter), jnp.bfloat16))
    jaxpr = jax.make_jaxpr(moe_experts_pallas)(*args)
    costs = {e.params["name"]: e.params["cost_estimate"]
             for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"}
    block_m = pallas_block_m(num_tokens * top_k, num_experts)
    rows = num_tiles(num_tokens * top_k, num_experts, block_m) * block_m
    assert rows == 248 * 16  # 2048 routes + at most 128 * 15 padding rows, in tiles of 16
    assert costs["moe_gate_up"].flops == 2 * rows * hidden * 2 * inter
    assert costs["moe_gate_up"].transcendentals == rows * inter
    assert costs["moe_down"].flops == 2 * rows * inter * hidden


def test_no_tokens():
    case = random_case(0, 0, 2, 4, H, INTER, jnp.float32, "one")
    assert moe_experts_pallas(*case, interpret=True).shape == (0, H)


def test_bad_knobs_are_refused():
    case = random_case(0, 2, 1, 2, H, INTER, jnp.float32)
    with pytest.raises(TypeError, match="unknown moe knobs"):
        moe_experts_pallas(*case, interpret=True, block_z=16)
    with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
        moe_experts_pallas(*case, interpret=True, block_n=24)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_lowers_to_two_triton_kernels(dtype):
    """The Pallas -> Triton IR lowering for CUDA (on this jax line), at decode and prefill tile sizes."""
    for num_tokens in (2, 64):
        case = random_case(0, num_tokens, 2, 8, 64, 96, dtype)
        text = lower_for_cuda(jax.jit(moe_experts_pallas), *case)
        assert text.count("__gpu$xla.gpu.triton") == 2
