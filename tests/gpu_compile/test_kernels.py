"""Every Pallas kernel at Llama-3-8B and -70B shapes, compiled for an H200 (sm_90a) at its default settings: each
launch must fit sm_90 (at most 255 registers per thread, no spills, at most 227 KiB of shared memory per block,
at least one resident block per SM).

Shapes: Llama-3-8B has 32 query heads, 8 KV heads of 128, hidden 4096, MLP 14336; -70B 64 query heads, 8 KV heads,
hidden 8192, MLP 28672. KV blocks of 16 tokens, bfloat16 activations.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.awq_matmul import AWQPacked, awq_matmul
from pallas_kernels.lora import lora_delta
from pallas_kernels.paged_attention import ragged_paged_attention, split_kv_paged_attention

BF16, I32 = jnp.bfloat16, jnp.int32
SCALE = 128 ** -0.5


def attention_args(tokens, seqs, context, q_heads, kv_heads=8, layers=32, blocks=4096, dtype=BF16):
    """q [T, Hq, D], k/v pools [L, N, Hkv, B, D], layer, block tables [S, MB], context lens [S], starts [S+1]."""
    s = jax.ShapeDtypeStruct
    pool = s((layers, blocks, kv_heads, 16, 128), dtype)
    return (s((tokens, q_heads, 128), dtype), pool, pool, s((), I32), s((seqs, -(-context // 16)), I32),
            s((seqs,), I32), s((seqs + 1,), I32))


def awq_args(m, k, n, group=128, dtype=BF16, scales=jnp.float16):
    s = jax.ShapeDtypeStruct
    return s((m, k), dtype), AWQPacked(s((k // 8, n), I32), s((k // group, n), jnp.int8), s((k // group, n), scales))


def lora_args(tokens, k, n, rank, slots=4):
    s = jax.ShapeDtypeStruct
    return s((tokens, k), BF16), s((slots, rank, k), BF16), s((slots, n, rank), BF16), s((tokens,), I32)


split = functools.partial(split_kv_paged_attention, sm_scale=SCALE)


def ragged(max_query_len):
    return functools.partial(ragged_paged_attention, max_query_len=max_query_len, sm_scale=SCALE)


CASES = {  # name -> (kernel name prefix, function, abstract args)
    "split_kv 8B b1 ctx8192": ("split_kv", split, attention_args(1, 1, 8192, 32)),
    "split_kv 8B b64 ctx4096": ("split_kv", split, attention_args(64, 64, 4096, 32)),
    "split_kv 8B b256 ctx1024": ("split_kv", split, attention_args(256, 256, 1024, 32)),
    "split_kv 70B b1 ctx8192": ("split_kv", split, attention_args(1, 1, 8192, 64, layers=80)),
    "ragged 8B decode b64 ctx4096": ("ragged", ragged(1), attention_args(64, 64, 4096, 32)),
    "ragged 8B mixed T512": ("ragged", ragged(512), attention_args(512, 64, 2048, 32)),  # the engine: mql = T
    "ragged 8B prefill T2048": ("ragged", ragged(2048), attention_args(2048, 1, 2048, 32)),
    "ragged 70B prefill T2048": ("ragged", ragged(2048), attention_args(2048, 1, 2048, 64, layers=80)),
    "awq 8B M1 qkv": ("awq", awq_matmul, awq_args(1, 4096, 6144)),
    "awq 8B M1 gate_up": ("awq", awq_matmul, awq_args(1, 4096, 28672)),
    "awq 8B M1 down": ("awq", awq_matmul, awq_args(1, 14336, 4096)),
    "awq 8B M16 qkv": ("awq", awq_matmul, awq_args(16, 4096, 6144)),
    "awq 8B M256 gate_up": ("awq", awq_matmul, awq_args(256, 4096, 28672)),
    "awq 8B M1 f16": ("awq", awq_matmul, awq_args(1, 4096, 14336, dtype=jnp.float16)),
    "awq 70B M1 gate_up": ("awq", awq_matmul, awq_args(1, 8192, 57344)),
    "lora 8B T1 qkv R48": ("lora", lora_delta, lora_args(1, 4096, 6144, 48)),
    "lora 8B T256 qkv R48": ("lora", lora_delta, lora_args(256, 4096, 6144, 48)),
    "lora 8B T256 down R16": ("lora", lora_delta, lora_args(256, 14336, 4096, 16)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_fits_sm90(h200, case):
    prefix, fn, args = CASES[case]
    placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=h200.replicated()), args)
    report = h200.compile(jax.jit(fn), *placed)
    kernels = report.kernels_named(prefix)
    assert kernels, f"no {prefix}* kernel among {[k.name for k in report.kernels]}"
    problems = {k.name: k.problems() for k in kernels if k.problems()}
    assert not problems, problems
