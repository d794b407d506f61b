"""The jnp reference attention (the CPU path and the kernels' oracle) against a float64 token-by-token oracle.

The reference cuts its work into decode-row groups, prefill query tiles and key chunks whose counts come from the
data; the cases below cross every boundary: more decode rows than one group, prompts longer than one tile,
contexts longer than one key chunk, rows in any order, padded sequences in the middle, padding tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import ragged_paged_attention_reference, reference as ref
from pallas_kernels.paged_attention.testing import dense_oracle, random_ragged_case, relative_error
from jaxllm.compile_counter import CompileCounter

CHUNK_TOKENS = ref.KV_CHUNK_BLOCKS * 16
CASES = [
    ("decode_three_groups", [(1, 1 + 7 * i) for i in range(ref.DECODE_ROWS * 2 + 3)], dict(num_q_heads=8,
                                                                                         num_kv_heads=2)),
    ("decode_long_contexts", [(1, CHUNK_TOKENS * 2 + 5), (1, 3), (1, CHUNK_TOKENS)], dict(num_q_heads=9,
                                                                                         num_kv_heads=3)),
    ("prompts_many_tiles", [(ref.QUERY_TILE * 2 + 7, ref.QUERY_TILE * 2 + 7), (2, 2), (ref.QUERY_TILE, 40)],
     dict(num_q_heads=4, num_kv_heads=4)),
    ("mixed_any_order", [(9, 41), (1, 30), (0, 0), (16, 16), (1, 1), (5, CHUNK_TOKENS + 9), (1, 77)],
     dict(num_q_heads=6, num_kv_heads=2, head_dim=32, pad_seqs=2, pad_tokens=5)),
    ("long_prefix_chunk", [(40, CHUNK_TOKENS * 3 + 1), (1, 2)], dict(num_q_heads=8, num_kv_heads=1, block_size=32)),
    ("bf16", [(3, 50), (1, 1), (12, 70)], dict(num_q_heads=8, num_kv_heads=2, dtype=jnp.bfloat16)),
    ("one_token", [(1, 5)], dict(num_q_heads=2, num_kv_heads=1)),
    ("padding_only", [], dict(num_q_heads=4, num_kv_heads=2, pad_seqs=3, pad_tokens=4)),
]
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2e-2}


@pytest.mark.parametrize("case_id,seqs,layout", CASES, ids=[c[0] for c in CASES])
def test_reference_matches_dense_oracle(case_id, seqs, layout):
    layout = dict(dict(head_dim=64, block_size=16), **layout)
    case = random_ragged_case(len(case_id), seqs, **layout)
    sm_scale = case.q.shape[-1] ** -0.5
    out = np.asarray(jax.jit(functools.partial(ragged_paged_attention_reference, sm_scale=sm_scale))(*case.args()),
                     np.float32)
    valid = case.num_valid_tokens
    assert np.all(out[valid:] == 0), "padding tokens must come out as zeros"
    if valid:
        expected = dense_oracle(case, sm_scale)
        assert relative_error(out[:valid], expected[:valid]) < TOLERANCE[case.q.dtype]


def test_one_program_serves_every_mix():
    """Fixed array shapes, different query lengths and contexts: one compile, every result right."""
    mixes = [[(1, 200)] * 6, [(30, 30), (1, 5), (1, 9)], [(2, 180), (17, 17)], [(1, 1)]]
    cases = [_padded_case(seed, seqs, num_tokens=40, num_seqs=6, max_blocks=16) for seed, seqs in enumerate(mixes)]
    attend = jax.jit(functools.partial(ragged_paged_attention_reference, sm_scale=0.125))
    with CompileCounter() as compiles:
        outs = [np.asarray(attend(*case.args())) for case in cases]
    assert compiles.count == 1
    for case, out in zip(cases, outs):
        valid = case.num_valid_tokens
        assert relative_error(out[:valid], dense_oracle(case, 0.125)[:valid]) < 1e-5


def _padded_case(seed, seqs, *, num_tokens, num_seqs, max_blocks):
    tokens = sum(q for q, _ in seqs)
    blocks = max(-(-c // 16) for _, c in seqs)
    return random_ragged_case(seed, seqs, num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                              pad_seqs=num_seqs - len(seqs), pad_tokens=num_tokens - tokens,
                              pad_blocks=max_blocks - blocks, spare_blocks=100 - sum(-(-c // 16) for _, c in seqs))
