"""AWQ int4 expert stacks (pallas_kernels/moe/awq.py) through moe_experts: the reference, the routed CPU loop and
the Pallas kernels (awq_kernel.py, interpret mode) against the dense oracle run on weights dequantized independently
in numpy ((q - z) * s); the Pallas kernels' 16-bit dequantization (bf16 scales) against the reference; their CUDA
lowering; the CPU loop dequantizes only the experts it runs (no dense [E, ...] stack in its program, where the
reference has one); the native CPU kernel refuses int4 stacks by name."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.quantization.group_quant import quantize_groups
from pallas_kernels.awq_matmul.layout import AWQPacked, pack_rows, with_scale_dtype
from pallas_kernels.moe import moe_experts, moe_experts_reference
from pallas_kernels.moe.cpu import moe_experts_cpu
from pallas_kernels.moe.kernel import moe_experts_pallas
from pallas_kernels.moe.testing import TOLERANCE, random_case, relative_error
from tests.cuda_lowering import lower_for_cuda

H, INTER, GROUP = 64, 48, 16
CASES = [  # (T, k, E, routing)
    (1, 1, 1, "uniform"), (1, 2, 8, "uniform"), (9, 2, 8, "uniform"), (16, 2, 8, "one"), (24, 4, 16, "skewed"),
    (17, 2, 8, "out_of_range"), (0, 2, 8, np.zeros((0, 2), np.int32)),
]


def quantize_stack(w: jax.Array) -> tuple[AWQPacked, np.ndarray]:
    """A dense stack [E, N, K] -> (its RTN int4 AWQPacked stack, the dense [E, N, K] float32 it dequantizes to,
    computed in numpy from the codes)."""
    packed, dense = [], []
    for one in np.asarray(w, np.float32):  # [N, K]
        q, z, s = (np.asarray(a) for a in quantize_groups(jnp.asarray(one), GROUP))  # [N, K], [N, K/G] x2
        packed.append(AWQPacked(qweight=pack_rows(q.T), zeros=z.T.astype(np.int8), scales=s.T.astype(np.float16)))
        dense.append((q - np.repeat(z, GROUP, axis=1)).astype(np.float32) * np.repeat(s, GROUP, axis=1))
    stack = jax.tree.map(lambda *leaves: jnp.asarray(np.stack(leaves)), *packed)  # leaves [E, K/8 | K/G, N]
    return stack, np.stack(dense)


def awq_case(num_tokens, top_k, num_experts, routing, dtype):
    """(x, ids, weights, packed gate_up, packed down) and the oracle's output on the dequantized weights."""
    case = random_case(num_tokens + 1, num_tokens, top_k, num_experts, H, INTER, dtype, routing)
    (gate_up, dense_gate_up), (down, dense_down) = quantize_stack(case.w_gate_up), quantize_stack(case.w_down)
    want = moe_experts_reference(case.x, case.expert_ids, case.expert_weights,
                                 jnp.asarray(dense_gate_up).astype(dtype), jnp.asarray(dense_down).astype(dtype))
    return (case.x, case.expert_ids, case.expert_weights, gate_up, down), want


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("num_tokens, top_k, num_experts, routing", CASES)
@pytest.mark.parametrize("implementation", ["reference", "cpu", "pallas"])
def test_int4_experts_match_the_oracle_on_dequantized_weights(implementation, num_tokens, top_k, num_experts,
                                                              routing, dtype):
    args, want = awq_case(num_tokens, top_k, num_experts, routing, dtype)
    got = jax.jit(functools.partial(moe_experts, implementation=implementation, interpret=True))(*args)
    assert got.dtype == want.dtype and got.shape == want.shape == (num_tokens, H)
    if num_tokens:
        assert np.abs(np.asarray(want, np.float32)).max() > 0.1
        assert relative_error(got, want) <= TOLERANCE[jnp.dtype(dtype)]


def test_one_stack_packed_the_other_dense():
    case = random_case(10, 9, 2, 8, H, INTER, jnp.float32, "skewed")
    gate_up, dense_gate_up = quantize_stack(case.w_gate_up)
    want = moe_experts_reference(case.x, case.expert_ids, case.expert_weights, jnp.asarray(dense_gate_up),
                                 case.w_down)
    got = moe_experts_cpu(case.x, case.expert_ids, case.expert_weights, gate_up, case.w_down)
    assert relative_error(got, want) <= TOLERANCE[jnp.dtype(jnp.float32)]


def _dense_stack_shapes(num_experts):
    """The shapes, as StableHLO writes them, of a dequantized [E, N, K] stack (either orientation)."""
    return [f"{num_experts}x{a}x{b}xf32" for a, b in ((2 * INTER, H), (H, 2 * INTER), (H, INTER), (INTER, H))]


@pytest.mark.parametrize("implementation, dense_stack", [("cpu", False), ("reference", True)])
def test_only_the_cpu_loop_avoids_dequantizing_every_expert(implementation, dense_stack):
    """The CPU loop dequantizes one expert at a time inside its loop over the used experts; the reference (the
    check's control) writes whole dequantized stacks."""
    args, _ = awq_case(4, 2, 16, "uniform", jnp.float32)
    text = jax.jit(functools.partial(moe_experts, implementation=implementation)).lower(*args).as_text()
    assert any(shape in text for shape in _dense_stack_shapes(16)) == dense_stack


@pytest.mark.parametrize("routing", ["uniform", "one", "skewed"])
def test_pallas_16_bit_dequantization_matches_the_reference(routing):
    """bf16 activations with bf16 scales: the kernels' magic-number dequantization (no float32 per weight)."""
    args, _ = awq_case(12, 2, 8, routing, jnp.bfloat16)
    x, ids, weights, gate_up, down = args
    gate_up, down = with_scale_dtype(gate_up, jnp.bfloat16), with_scale_dtype(down, jnp.bfloat16)
    want = moe_experts(x, ids, weights, gate_up, down, implementation="reference")
    got = moe_experts_pallas(x, ids, weights, gate_up, down, interpret=True, block_m=16, block_k=256)
    assert relative_error(got, want) <= TOLERANCE[jnp.dtype(jnp.bfloat16)]


def test_pallas_one_stack_int4_the_other_dense():
    case = random_case(11, 9, 2, 8, H, INTER, jnp.float32, "skewed")
    down, _ = quantize_stack(case.w_down)
    want = moe_experts(case.x, case.expert_ids, case.expert_weights, case.w_gate_up, down)
    got = moe_experts_pallas(case.x, case.expert_ids, case.expert_weights, case.w_gate_up, down, interpret=True)
    assert relative_error(got, want) <= TOLERANCE[jnp.dtype(jnp.float32)]


def test_pallas_int4_needs_a_deep_enough_k_step():
    args, _ = awq_case(4, 2, 8, "uniform", jnp.float32)
    with pytest.raises(ValueError, match="block_k must be >= 128 with an AWQ int4 expert stack"):
        moe_experts_pallas(*args, interpret=True, block_k=64)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_int4_kernels_lower_to_two_triton_kernels(dtype):
    """The Pallas -> Triton IR lowering for CUDA; with bf16 scales the 16-bit dequantization's inline PTX."""
    for num_tokens in (2, 64):
        args, _ = awq_case(num_tokens, 2, 8, "uniform", dtype)
        x, ids, weights, gate_up, down = args
        gate_up, down = with_scale_dtype(gate_up, dtype), with_scale_dtype(down, dtype)
        text = lower_for_cuda(jax.jit(moe_experts_pallas), x, ids, weights, gate_up, down)
        assert text.count("__gpu$xla.gpu.triton") == 2
        assert ("prmt.b32" in text) == (dtype == jnp.bfloat16)


def test_native_cpu_kernel_refuses_int4_experts():
    args, _ = awq_case(4, 2, 8, "uniform", jnp.float32)
    with pytest.raises(ValueError, match="dense stacks of one dtype.*int4 \\(AWQ\\)"):
        moe_experts_cpu(*args, native=True)


def test_a_stack_whose_groups_do_not_divide_its_rows_is_refused():
    args, _ = awq_case(4, 2, 8, "uniform", jnp.float32)
    x, ids, weights, gate_up, down = args
    bad = AWQPacked(qweight=down.qweight[:, :5], zeros=down.zeros, scales=down.scales)  # K = 40 rows in 3 groups
    with pytest.raises(ValueError, match="w_down: an int4 expert stack"):
        moe_experts(x, ids, weights, gate_up, bad)
