"""The routed MoE's Pallas kernels at Qwen3-30B-A3B's expert shapes (hidden 2048, moe_intermediate_size 768,
128 experts, top-8, bfloat16), compiled for an H200 (sm_90a): both launches fit sm_90 (registers, no spills,
shared memory, a resident block per SM), at decode (T = 8) and prefill (T = 256) sizes; and so do the int4 launches
(AWQ expert stacks, group 128), their weights dequantized in PTX (prmt) into bf16 MMAs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.awq_matmul.layout import AWQPacked
from pallas_kernels.moe import moe_experts
from pallas_kernels.moe.kernel import pallas_block_m
from pallas_kernels.moe.layout import num_tiles

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8


def moe_args(tokens, dtype=jnp.bfloat16):
    s = jax.ShapeDtypeStruct
    return (s((tokens, HIDDEN), dtype), s((tokens, TOP_K), jnp.int32), s((tokens, TOP_K), jnp.float32),
            s((EXPERTS, 2 * INTER, HIDDEN), dtype), s((EXPERTS, HIDDEN, INTER), dtype))


def pallas_moe(*args):
    return moe_experts(*args, implementation="pallas")


def compiled_moe_kernels(h200, args, tokens: int, suffix: str = "") -> list:
    """The gate_up and down kernels of the Pallas MoE compiled for the H200 on `args`: one of each (named
    moe_gate_up{suffix}*, moe_down{suffix}*), each fitting sm_90, over (tiles, column blocks) with the tile axis first
    (fastest)."""
    placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=h200.replicated()), args)
    report = h200.compile(jax.jit(pallas_moe), *placed)
    tiles = num_tiles(tokens * TOP_K, EXPERTS, pallas_block_m(tokens * TOP_K, EXPERTS))
    found = []
    for prefix, columns in ((f"moe_gate_up{suffix}", INTER), (f"moe_down{suffix}", HIDDEN)):
        kernels = report.kernels_named(prefix)
        assert len(kernels) == 1, f"no single {prefix}* kernel among {[k.name for k in report.kernels]}"
        assert kernels[0].problems() == [], kernels[0]
        assert kernels[0].grid[:2] == (tiles, -(-columns // 64)), kernels[0]
        print(f"T={tokens} {kernels[0]}")
        found.append(kernels[0])
    return found


@pytest.mark.parametrize("tokens", [8, 256])
def test_moe_kernels_fit_sm90(h200, tokens):
    compiled_moe_kernels(h200, moe_args(tokens), tokens)


GROUP = 128  # AutoAWQ's usual group size


def awq_moe_args(tokens):
    """moe_args with both expert stacks AWQ int4 (awq.py's layout), scales in bfloat16 as a bf16 model holds them."""
    s = jax.ShapeDtypeStruct

    def stack(k, n):  # the stack of E experts' W [K, N]
        return AWQPacked(qweight=s((EXPERTS, k // 8, n), jnp.int32), zeros=s((EXPERTS, k // GROUP, n), jnp.int8),
                         scales=s((EXPERTS, k // GROUP, n), jnp.bfloat16))

    return moe_args(tokens)[:3] + (stack(HIDDEN, 2 * INTER), stack(INTER, HIDDEN))


@pytest.mark.parametrize("tokens", [8, 256])
def test_int4_moe_kernels_fit_sm90(h200, tokens):
    """The int4 grouped matmuls (awq_kernel.py) at the same shapes: both fit sm_90 and dequantize in PTX."""
    for kernel in compiled_moe_kernels(h200, awq_moe_args(tokens), tokens, suffix="_int4"):
        with open(kernel.ptx) as f:
            ptx = f.read()
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx and "prmt.b32" in ptx, kernel
