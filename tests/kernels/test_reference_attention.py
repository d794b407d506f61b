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
from pallas_kernels.paged_attention.testing import (dense_oracle, poison_keys_before, random_ragged_case,
                                                    relative_error)
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


# Sliding windows (W) and logit soft-capping: windows below, equal to and above the contexts, windows that are not
# a multiple of the block size (16) or of the key chunk, decode rows next to prompt chunks after cached prefixes.
OPTION_CASES = [
    ("w5_decode_and_chunks", [(1, 40), (9, 41), (1, 3), (20, 90)], dict(sliding_window=5), {}),
    ("w16_equal_block", [(1, 16), (16, 16), (3, 70)], dict(sliding_window=16), {}),
    ("w70_equals_a_context", [(1, 70), (5, 70), (1, 200)], dict(sliding_window=70), {}),
    ("w100_longer_than_contexts", [(1, 40), (12, 60)], dict(sliding_window=100), {}),
    ("w37_long_prompt_many_tiles", [(ref.QUERY_TILE * 2 + 7, CHUNK_TOKENS * 2 + 20), (1, CHUNK_TOKENS * 3)],
     dict(sliding_window=37), {}),
    ("softcap_only", [(1, 50), (7, 30)], dict(logit_softcap=2.0), {}),
    ("w21_softcap_d128", [(1, 100), (13, 77), (0, 0)], dict(sliding_window=21, logit_softcap=5.0),
     dict(head_dim=128, pad_seqs=1, pad_tokens=3)),
    ("w50_softcap_d256_g4", [(1, 120), (6, 66)], dict(sliding_window=50, logit_softcap=30.0),
     dict(head_dim=256, num_q_heads=8, num_kv_heads=2)),
    ("w9_bf16", [(1, 45), (10, 30)], dict(sliding_window=9, logit_softcap=3.0), dict(dtype=jnp.bfloat16)),
]


@pytest.mark.parametrize("case_id,seqs,options,layout", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_options_match_dense_oracle(case_id, seqs, options, layout):
    layout = dict(dict(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16), **layout)
    case = random_ragged_case(len(case_id), seqs, **layout)
    sm_scale = case.q.shape[-1] ** -0.5 * 4  # scores large enough for the cap to bite
    attend = jax.jit(functools.partial(ragged_paged_attention_reference, sm_scale=sm_scale, **options))
    out = np.asarray(attend(*case.args()), np.float32)
    valid = case.num_valid_tokens
    assert np.all(out[valid:] == 0), "padding tokens must come out as zeros"
    expected = dense_oracle(case, sm_scale, **options)
    assert relative_error(out[:valid], expected[:valid]) < TOLERANCE[case.q.dtype]
    if options.get("logit_softcap") or options["sliding_window"] < max(c for _, c in seqs):
        unwindowed = dense_oracle(case, sm_scale)  # the options change the result: the case exercises them
        assert relative_error(expected[:valid], unwindowed[:valid]) > 10 * TOLERANCE[case.q.dtype]


@pytest.mark.parametrize("seqs", [[(1, 300)], [(40, 300)]], ids=["decode", "prompt_chunk"])
def test_window_reads_no_chunk_before_it(seqs):
    """Keys in the key chunks wholly before a piece's window are never read: NaN there leaves the result intact
    (so a windowed step costs its window, not its context)."""
    window = 20
    case = random_ragged_case(3, seqs, num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16)
    q_len, context = seqs[0]
    first_key = context - q_len - window + 1  # the first key the chunk's first query sees
    width = ref.KV_CHUNK_BLOCKS * 16
    unread = first_key // width * width  # keys before the chunk holding it
    assert unread >= width
    poisoned = poison_keys_before(case, 0, unread)
    attend = jax.jit(functools.partial(ragged_paged_attention_reference, sm_scale=0.2, sliding_window=window))
    out = np.asarray(attend(*poisoned.args()), np.float32)
    assert not np.isnan(out).any()
    assert relative_error(out, dense_oracle(case, 0.2, sliding_window=window)) < 1e-5


@pytest.mark.parametrize("options,argument", [(dict(sliding_window=0), "sliding_window"),
                                              (dict(sliding_window=2.5), "sliding_window"),
                                              (dict(sliding_window=True), "sliding_window"),
                                              (dict(sliding_window=jnp.int32(8)), "sliding_window"),
                                              (dict(logit_softcap=float("nan")), "logit_softcap"),
                                              (dict(logit_softcap=0.0), "logit_softcap"),
                                              (dict(logit_softcap=-1.0), "logit_softcap")])
def test_bad_options_are_rejected(options, argument):
    case = random_ragged_case(0, [(1, 5)], num_q_heads=2, num_kv_heads=1, head_dim=32, block_size=16)
    with pytest.raises(ValueError, match=argument):
        ragged_paged_attention_reference(*case.args(), sm_scale=1.0, **options)
