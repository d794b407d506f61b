"""The ragged paged-attention kernel (interpret mode) against the jnp reference on fresh random inputs.

Inputs are poisoned so that a kernel which reads or writes outside its lanes fails: the output buffer starts as NaN
(valid rows must all be written, padding rows must stay untouched), and every pool slot that holds no context token
(null block, block tails, spare blocks, the other layer) is NaN for the kernel and 0 for the reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import ragged_paged_attention
from pallas_kernels.paged_attention.kernel import default_knobs, ragged_paged_attention_into, tile_shape
from pallas_kernels.paged_attention.testing import (TOLERANCE, RaggedCase, poison_keys_before, poison_unused_slots,
                                                    random_ragged_case, reference_output, relative_error)

# (id, sequences as (q_len, context_len) with (0, 0) a padded sequence, layout overrides, kernel knobs)
CASES = [
    ("decode", [(1, 1), (1, 15), (1, 16), (1, 17), (1, 40)], dict(num_q_heads=8, num_kv_heads=2), {}),
    ("whole_prompts_mha", [(20, 20), (7, 7), (33, 33)], dict(num_q_heads=2, num_kv_heads=2), {}),
    ("chunked_mixed_g3_padded", [(1, 30), (0, 0), (9, 41), (16, 16), (5, 5)],
     dict(num_q_heads=6, num_kv_heads=2, head_dim=128, block_size=32, pad_seqs=2, pad_tokens=5), {}),
    ("g8_bf16", [(3, 50), (1, 1), (12, 70)], dict(num_q_heads=8, num_kv_heads=1, dtype=jnp.bfloat16), {}),
    ("g4_bf16_d128_b32", [(1, 64), (17, 33), (4, 100)],
     dict(num_q_heads=8, num_kv_heads=2, head_dim=128, block_size=32, dtype=jnp.bfloat16, pad_blocks=2), {}),
    ("small_tiles_many_steps", [(11, 90), (1, 33), (6, 6)], dict(num_q_heads=4, num_kv_heads=1, pad_seqs=1),
     dict(block_q=2, block_kv=16)),
    ("padding_only", [], dict(num_q_heads=4, num_kv_heads=2, pad_seqs=3, pad_tokens=4), {}),
]


def _case(seqs, layout, seed) -> RaggedCase:
    layout = dict(dict(head_dim=64, block_size=16), **layout)
    return random_ragged_case(seed, seqs, **layout)


@pytest.mark.parametrize("case_id,seqs,layout,knobs", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference(case_id, seqs, layout, knobs):
    case = _case(seqs, layout, seed=len(case_id))
    sm_scale = case.q.shape[-1] ** -0.5
    expected = reference_output(case, sm_scale)
    poisoned = poison_unused_slots(case, float("nan"))
    kernel = jax.jit(functools.partial(ragged_paged_attention_into, max_query_len=case.max_query_len,
                                       sm_scale=sm_scale, interpret=True, **knobs))
    out = np.asarray(kernel(jnp.full_like(case.q, jnp.nan), *poisoned.args()), np.float32)

    valid = case.num_valid_tokens
    assert not np.isnan(out[:valid]).any(), "a valid output row was not written or read a poisoned slot"
    assert np.isnan(out[valid:]).all(), "the kernel wrote a padding token's row"
    if valid:
        assert relative_error(out[:valid], expected[:valid]) < TOLERANCE[case.q.dtype]


def test_padding_tokens_come_out_zero():
    case = _case([(3, 20), (1, 9)], dict(num_q_heads=4, num_kv_heads=2, pad_seqs=1, pad_tokens=3), seed=7)
    out = ragged_paged_attention(*case.args(), max_query_len=case.max_query_len, sm_scale=0.125, interpret=True)
    expected = reference_output(case, 0.125)
    assert np.all(np.asarray(out)[case.num_valid_tokens:] == 0)
    assert relative_error(out, expected) < TOLERANCE[jnp.dtype(jnp.float32)]


def test_bad_knobs_are_rejected():
    case = _case([(1, 5)], dict(num_q_heads=2, num_kv_heads=1), seed=0)
    with pytest.raises(ValueError, match="block_kv"):
        ragged_paged_attention(*case.args(), max_query_len=1, sm_scale=1.0, block_kv=24, interpret=True)


@pytest.mark.parametrize("group,max_query_len,block_q,expected", [
    (4, 1, None, (1, 16)),  # decode: the group is padded to 16 rows
    (4, 300, None, (16, 4)),  # prefill: 64 rows
    (3, 5, None, (8, 4)),  # the tile never exceeds the longest query
    (1, 128, 32, (32, 1)),
    (8, 128, 1, (1, 16)),
])
def test_tile_shape(group, max_query_len, block_q, expected):
    tq, gp = tile_shape(group, max_query_len, block_q)
    assert (tq, gp) == expected
    assert tq * gp >= 16 and tq * gp & (tq * gp - 1) == 0


# Sliding windows and soft-capping against the reference: windows below, at and above the contexts, not multiples of
# the block (16) or of block_kv; decode rows beside prompt chunks after cached prefixes; head sizes 64, 128, 256.
OPTION_CASES = [
    ("w5_mixed", [(1, 40), (9, 41), (1, 3), (20, 90)], dict(sliding_window=5), {}, {}),
    ("w16_softcap", [(1, 16), (16, 16), (3, 70)], dict(sliding_window=16, logit_softcap=2.0), {}, {}),
    ("w70_at_a_context_d128", [(1, 70), (5, 70), (1, 150), (0, 0)], dict(sliding_window=70),
     dict(head_dim=128, block_size=32, pad_tokens=3), {}),
    ("w100_above_contexts", [(1, 40), (12, 60)], dict(sliding_window=100), {}, {}),
    ("w21_small_tiles", [(11, 90), (1, 33), (6, 6)], dict(sliding_window=21, logit_softcap=5.0),
     dict(num_kv_heads=1), dict(block_q=2, block_kv=16)),
    ("softcap_d256", [(1, 50), (7, 30)], dict(logit_softcap=2.0), dict(head_dim=256), {}),
    ("w37_softcap_d256_bf16_64_rows", [(1, 120), (20, 66)], dict(sliding_window=37, logit_softcap=30.0),
     dict(head_dim=256, dtype=jnp.bfloat16), {}),
]


@pytest.mark.parametrize("case_id,seqs,options,layout,knobs", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_options_match_reference(case_id, seqs, options, layout, knobs):
    case = _case(seqs, dict(dict(num_q_heads=4, num_kv_heads=2), **layout), seed=len(case_id))
    sm_scale = case.q.shape[-1] ** -0.5 * 4  # scores large enough for the cap to bite
    expected = reference_output(case, sm_scale, **options)
    kernel = jax.jit(functools.partial(ragged_paged_attention_into, max_query_len=case.max_query_len,
                                       sm_scale=sm_scale, interpret=True, **options, **knobs))
    out = np.asarray(kernel(jnp.full_like(case.q, jnp.nan), *poison_unused_slots(case, float("nan")).args()))
    valid = case.num_valid_tokens
    assert np.isnan(out[valid:]).all(), "the kernel wrote a padding token's row"
    assert relative_error(out[:valid], expected[:valid]) < TOLERANCE[case.q.dtype]


def test_window_skips_the_tiles_before_it():
    """NaN in the KV tiles wholly before a sequence's window (its first query's) never reaches the result."""
    window, block_kv = 20, 16
    case = _case([(9, 200), (1, 150)], dict(num_q_heads=4, num_kv_heads=2), seed=3)
    first_key = 200 - 9 - window + 1
    poisoned = poison_keys_before(case, 0, first_key // block_kv * block_kv)
    poisoned = poison_keys_before(poisoned, 1, (150 - window) // block_kv * block_kv)
    out = ragged_paged_attention(*poisoned.args(), max_query_len=9, sm_scale=0.2, sliding_window=window,
                                 block_kv=block_kv, interpret=True)
    expected = reference_output(case, 0.2, sliding_window=window)
    assert relative_error(out, expected) < TOLERANCE[case.q.dtype]


@pytest.mark.parametrize("head_dim,rows,expected", [
    (64, 64, (64, 4)), (128, 64, (64, 4)), (128, 16, (64, 4)),  # heads up to 128: as they always were
    (256, 16, (64, 4)),  # a decode tile of head 256 fits 4 warps at 64 keys
    (256, 64, (32, 8)),  # a prefill tile of head 256 would spill there
])
def test_default_knobs(head_dim, rows, expected):
    assert default_knobs(head_dim, rows) == expected
