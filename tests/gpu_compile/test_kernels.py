"""Every Pallas kernel at Llama-3-8B and -70B shapes (the attention kernels also at Gemma 2 / Gemma 3 shapes, head
size 256, and with sliding windows and soft-capping), compiled for an H200 (sm_90a) at its default settings: each
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


def attention_args(tokens, seqs, context, q_heads, kv_heads=8, layers=32, blocks=4096, dtype=BF16, head_dim=128):
    """q [T, Hq, D], k/v pools [L, N, Hkv, B, D], layer, block tables [S, MB], context lens [S], starts [S+1]."""
    s = jax.ShapeDtypeStruct
    pool = s((layers, blocks, kv_heads, 16, head_dim), dtype)
    return (s((tokens, q_heads, head_dim), dtype), pool, pool, s((), I32), s((seqs, -(-context // 16)), I32),
            s((seqs,), I32), s((seqs + 1,), I32))


def awq_args(m, k, n, group=128, dtype=BF16, scales=jnp.float16):
    s = jax.ShapeDtypeStruct
    return s((m, k), dtype), AWQPacked(s((k // 8, n), I32), s((k // group, n), jnp.int8), s((k // group, n), scales))


def lora_args(tokens, k, n, rank, slots=4):
    s = jax.ShapeDtypeStruct
    return s((tokens, k), BF16), s((slots, rank, k), BF16), s((slots, n, rank), BF16), s((tokens,), I32)


split = functools.partial(split_kv_paged_attention, sm_scale=SCALE)


def ragged(max_query_len, **options):
    return functools.partial(ragged_paged_attention, max_query_len=max_query_len, sm_scale=SCALE, **options)


# Gemma 2 (9B: 16 query heads, 8 KV heads of 256, 42 layers) attends locally in every other layer (window 4096)
# and soft-caps its scores at 50; Gemma 3 (4B: 8 query heads, 4 KV heads of 256, window 1024) only windows;
# Mistral-7B has Llama's head shape with a window of 4096.
GEMMA2 = dict(sliding_window=4096, logit_softcap=50.0)
gemma2_args = functools.partial(attention_args, q_heads=16, kv_heads=8, layers=42, head_dim=256)
gemma3_args = functools.partial(attention_args, q_heads=8, kv_heads=4, layers=34, head_dim=256)


CASES = {  # name -> (kernel name prefix, function, abstract args)
    "split_kv 8B b1 ctx8192": ("split_kv", split, attention_args(1, 1, 8192, 32)),
    "split_kv 8B b64 ctx4096": ("split_kv", split, attention_args(64, 64, 4096, 32)),
    "split_kv 8B b256 ctx1024": ("split_kv", split, attention_args(256, 256, 1024, 32)),
    "split_kv 70B b1 ctx8192": ("split_kv", split, attention_args(1, 1, 8192, 64, layers=80)),
    "ragged 8B decode b64 ctx4096": ("ragged", ragged(1), attention_args(64, 64, 4096, 32)),
    "ragged 8B mixed T512": ("ragged", ragged(512), attention_args(512, 64, 2048, 32)),  # the engine: mql = T
    "ragged 8B prefill T2048": ("ragged", ragged(2048), attention_args(2048, 1, 2048, 32)),
    "ragged 70B prefill T2048": ("ragged", ragged(2048), attention_args(2048, 1, 2048, 64, layers=80)),
    "split_kv gemma2-9B b1 ctx8192 window softcap": ("split_kv", functools.partial(split, **GEMMA2),
                                                      gemma2_args(1, 1, 8192)),
    "split_kv gemma2-9B b64 ctx4096 softcap": ("split_kv", functools.partial(split, logit_softcap=50.0),
                                               gemma2_args(64, 64, 4096)),
    "split_kv gemma3-4B b1 ctx32768 window1024": ("split_kv", functools.partial(split, sliding_window=1024),
                                                  gemma3_args(1, 1, 32768)),
    "split_kv mistral-7B b1 ctx16384 window": ("split_kv", functools.partial(split, sliding_window=4096),
                                               attention_args(1, 1, 16384, 32)),
    "ragged gemma2-9B decode b64 ctx4096": ("ragged", ragged(1, **GEMMA2), gemma2_args(64, 64, 4096)),
    "ragged gemma2-9B mixed T512 window softcap": ("ragged", ragged(512, **GEMMA2), gemma2_args(512, 64, 8192)),
    "ragged gemma2-9B prefill T2048 softcap": ("ragged", ragged(2048, logit_softcap=50.0),
                                               gemma2_args(2048, 1, 2048)),
    "ragged gemma3-4B prefill T2048": ("ragged", ragged(2048), gemma3_args(2048, 1, 2048)),
    "ragged mistral-7B mixed T512 window": ("ragged", ragged(512, sliding_window=4096),
                                            attention_args(512, 64, 8192, 32)),
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
