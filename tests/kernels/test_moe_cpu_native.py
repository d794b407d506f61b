"""The native CPU MoE kernel (pallas_kernels/moe/cpu_kernel.cc) against the jnp oracle, the compiled program's
reads of the expert weights in place, and cpu.py's static choice between it and the jnp loop (with its fallback
where the library cannot be built)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.model.kernels import select_kernels
from pallas_kernels.moe import cpu as moe_cpu
from pallas_kernels.moe import moe_experts, moe_experts_reference
from pallas_kernels.moe.cpu import NATIVE_MAX_TOKENS, moe_experts_cpu
from pallas_kernels.moe.cpu_native import KERNEL, moe_experts_native, moe_kernel_error
from pallas_kernels.moe.testing import TOLERANCE, random_case
from pallas_kernels.moe.testing import relative_error
from tests.compiled_hlo import materialized

CASES = [  # (T, k, E, routing): test_moe_cpu.py's cases
    (1, 1, 1, "uniform"), (1, 8, 64, "uniform"), (1, 2, 8, "uniform"), (9, 2, 8, "uniform"), (16, 2, 8, "one"),
    (24, 8, 64, "skewed"), (17, 2, 8, "out_of_range"), (12, 8, 8, "uniform"), (5, 2, 8, "skewed"),
]
H, INTER = 32, 48


def test_the_library_builds_here():
    assert moe_kernel_error() is None


# bfloat16: TOLERANCE's 2^-6, for the reason given there: the kernel rounds gate_up, act(gate), act(gate) * up and
# each expert's output to bfloat16 at the reference's points, but its float32 sums run in another order (and its
# exp / tanh are the C library's), so an intermediate can round one bf16 ulp (2^-8) the other way.
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("num_tokens, top_k, num_experts, routing", CASES)
def test_native_matches_the_reference(num_tokens, top_k, num_experts, routing, dtype):
    case = random_case(num_tokens, num_tokens, top_k, num_experts, H, INTER, dtype, routing)
    got = jax.jit(moe_experts_native)(*case)
    want = moe_experts_reference(*case)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert relative_error(got, want) <= TOLERANCE[jnp.dtype(dtype)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_gelu_tanh_activation(dtype):
    case = random_case(1, 6, 2, 4, H, INTER, dtype)
    got = moe_experts_native(*case, activation="gelu_tanh")
    assert relative_error(got, moe_experts_reference(*case, activation="gelu_tanh")) <= TOLERANCE[jnp.dtype(dtype)]


def test_dropped_routes_give_zero_and_their_weights_are_never_read():
    case = random_case(0, 4, 2, 8, H, INTER, jnp.float32, [[8, -1]] * 4)
    assert np.all(np.asarray(moe_experts_native(*case)) == 0)
    case = random_case(0, 3, 2, 8, H, INTER, jnp.float32, [[1, 9], [-1, 2], [3, 4]])
    nan_weights = case.expert_weights.at[0, 1].set(jnp.nan).at[1, 0].set(jnp.nan)
    got = moe_experts_native(case.x, case.expert_ids, nan_weights, *case[3:])
    assert relative_error(got, moe_experts_reference(*case)) <= 1e-5


def test_no_tokens():
    case = random_case(0, 0, 2, 4, H, INTER, jnp.float32, "one")
    assert moe_experts_native(*case).shape == (0, H)


def test_mixed_dtypes_are_refused_by_the_kernel_and_run_by_the_jnp_loop():
    case = random_case(0, 2, 2, 8, H, INTER, jnp.float32)
    w_gate_up = case.w_gate_up.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match="one dtype"):
        moe_experts_native(case.x, case.expert_ids, case.expert_weights, w_gate_up, case.w_down)
    got = moe_experts_cpu(case.x, case.expert_ids, case.expert_weights, w_gate_up, case.w_down)
    want = moe_experts_reference(case.x, case.expert_ids, case.expert_weights, w_gate_up, case.w_down)
    assert relative_error(got, want) <= 1e-5


def compiled_hlo(fn, case) -> str:
    return jax.jit(fn).lower(*case).compile().as_text()


def expert_shapes(case) -> set[tuple[int, ...]]:
    return {tuple(case.w_gate_up.shape[1:]), tuple(case.w_down.shape[1:])}  # [2I, H], [H, I]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_the_native_program_reads_the_experts_in_place(dtype):
    case = random_case(0, 8, 2, 8, 40, 24, dtype)  # H = 40, I = 24: no other array is [48, 40] or [40, 24]
    hlo = compiled_hlo(functools.partial(moe_experts_cpu, native=True), case)
    assert KERNEL.name in hlo
    assert materialized(hlo, expert_shapes(case)) == []


def test_the_jnp_loop_copies_each_expert_so_the_check_can_fail():
    case = random_case(0, 8, 2, 8, 40, 24, jnp.float32)
    hlo = compiled_hlo(functools.partial(moe_experts_cpu, native=False), case)
    assert KERNEL.name not in hlo
    assert materialized(hlo, expert_shapes(case))


def test_the_native_kernel_runs_up_to_its_token_count_and_the_jnp_loop_past_it():
    small = random_case(0, NATIVE_MAX_TOKENS, 2, 8, H, INTER, jnp.float32)
    large = random_case(0, NATIVE_MAX_TOKENS + 1, 2, 8, H, INTER, jnp.float32)
    assert KERNEL.name in compiled_hlo(moe_experts_cpu, small)
    assert KERNEL.name not in compiled_hlo(moe_experts_cpu, large)


def test_where_the_library_cannot_be_built_the_jnp_loop_runs(monkeypatch):
    monkeypatch.setattr(moe_cpu, "moe_kernel_error", lambda: "no C++ compiler: 'c++' is not on PATH")
    case = random_case(1, 2, 2, 8, H, INTER, jnp.float32)
    assert KERNEL.name not in compiled_hlo(moe_experts_cpu, case)
    assert select_kernels(attention="reference").moe == "cpu"  # "auto" on CPU stays cpu: its jnp loop
    got = moe_experts(*case, implementation="cpu")
    assert relative_error(got, moe_experts_reference(*case)) <= 1e-5
