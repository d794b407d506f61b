"""The routed CPU MoE's jnp loop (pallas_kernels/moe/cpu.py, native=False: what runs where the native kernel cannot)
against the jnp oracle, jitted, and its one compile per shape; the native kernel's tests are in
test_moe_cpu_native.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.compile_counter import CompileCounter
from jaxllm.model.kernels import select_kernels
from pallas_kernels.moe import moe_experts, moe_experts_reference
from pallas_kernels.moe.cpu import cpu_block_m, moe_experts_cpu
from pallas_kernels.moe.testing import TOLERANCE, random_case, relative_error, routing_ids

CASES = [  # (T, k, E, routing, block_m or None)
    (1, 1, 1, "uniform", None), (1, 8, 64, "uniform", None), (1, 2, 8, "uniform", 4),
    (9, 2, 8, "uniform", None), (9, 2, 8, "uniform", 4), (16, 2, 8, "one", 4), (24, 8, 64, "skewed", None),
    (17, 2, 8, "out_of_range", 2), (12, 8, 8, "uniform", 8), (5, 2, 8, "skewed", 1),
]
H, INTER = 32, 48


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("num_tokens, top_k, num_experts, routing, block_m", CASES)
def test_cpu_matches_the_reference(num_tokens, top_k, num_experts, routing, block_m, dtype):
    case = random_case(num_tokens, num_tokens, top_k, num_experts, H, INTER, dtype, routing)
    got = jax.jit(functools.partial(moe_experts_cpu, block_m=block_m, native=False))(*case)
    want = moe_experts_reference(*case)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert relative_error(got, want) <= TOLERANCE[jnp.dtype(dtype)]


def test_all_routes_out_of_range_give_zero():
    case = random_case(0, 4, 2, 8, H, INTER, jnp.float32, [[8, -1]] * 4)
    assert np.all(np.asarray(moe_experts_cpu(*case, native=False)) == 0)


def test_no_tokens():
    case = random_case(0, 0, 2, 4, H, INTER, jnp.float32, "one")
    assert moe_experts_cpu(*case, native=False).shape == (0, H)


def test_gelu_tanh_activation():
    case = random_case(1, 6, 2, 4, H, INTER, jnp.float32)
    got = moe_experts_cpu(*case, activation="gelu_tanh", native=False)
    assert relative_error(got, moe_experts_reference(*case, activation="gelu_tanh")) <= 1e-5


def test_dispatch_and_auto_on_cpu():
    case = random_case(2, 5, 2, 8, H, INTER, jnp.float32, "skewed")
    assert select_kernels(attention="reference").moe == "cpu"
    got = moe_experts(*case, implementation="cpu")
    assert relative_error(got, moe_experts_reference(*case)) <= 1e-5


def test_block_m_follows_the_mean_group():
    assert cpu_block_m(1, 64) == 1 and cpu_block_m(16, 64) == 1 and cpu_block_m(512, 64) == 8
    assert cpu_block_m(512, 8) == 64 and cpu_block_m(4096, 8) == 64


@pytest.mark.parametrize("native", [False, True], ids=["jnp", "native"])
def test_one_compile_for_every_routing(native):
    num_tokens, top_k, num_experts = 8, 2, 8
    case = random_case(3, num_tokens, top_k, num_experts, H, INTER, jnp.float32)
    step = jax.jit(functools.partial(moe_experts_cpu, native=native))
    step(*case)
    rng = np.random.default_rng(1)
    routings = [jnp.asarray(routing_ids(rng, num_tokens, top_k, num_experts, routing), jnp.int32)
                for routing in ("uniform", "one", "skewed", "out_of_range")]
    with CompileCounter() as compiles:
        outputs = [jax.block_until_ready(step(case.x, ids, *case[2:])) for ids in routings]
    assert compiles.count == 0
    for ids, got in zip(routings, outputs):
        assert relative_error(got, moe_experts_reference(case.x, ids, *case[2:])) <= 1e-5
