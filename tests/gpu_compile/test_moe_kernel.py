"""The routed MoE's Pallas kernels at Qwen3-30B-A3B's expert shapes (hidden 2048, moe_intermediate_size 768,
128 experts, top-8, bfloat16), compiled for an H200 (sm_90a): both launches fit sm_90 (registers, no spills,
shared memory, a resident block per SM), at decode (T = 8) and prefill (T = 256) sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

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


@pytest.mark.parametrize("tokens", [8, 256])
def test_moe_kernels_fit_sm90(h200, tokens):
    placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=h200.replicated()),
                          moe_args(tokens))
    report = h200.compile(jax.jit(pallas_moe), *placed)
    block_m = pallas_block_m(tokens * TOP_K, EXPERTS)
    tiles = num_tiles(tokens * TOP_K, EXPERTS, block_m)
    for prefix, columns in (("moe_gate_up", INTER), ("moe_down", HIDDEN)):
        kernels = report.kernels_named(prefix)
        assert len(kernels) == 1, f"no single {prefix}* kernel among {[k.name for k in report.kernels]}"
        assert kernels[0].problems() == [], kernels[0]
        assert kernels[0].grid[:2] == (tiles, -(-columns // 64)), kernels[0]  # the tile axis first (fastest)
        print(f"T={tokens} {kernels[0]}")
