"""The split-KV (flash-decoding) kernel (interpret mode) against the jnp reference on decode-only steps."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import split_kv_paged_attention
from pallas_kernels.paged_attention.split_kv import default_num_splits
from pallas_kernels.paged_attention.testing import (TOLERANCE, poison_unused_slots, random_ragged_case,
                                                    reference_output, relative_error)

# (id, context lengths (one query token each; 0: a padded sequence), layout overrides, kernel knobs)
CASES = [
    ("three_splits_g4", [1, 15, 0, 16, 17, 93], dict(num_q_heads=8, num_kv_heads=2), dict(num_splits=3, block_kv=16)),
    ("mha_padded_bf16", [40, 7], dict(num_q_heads=2, num_kv_heads=2, pad_seqs=2, pad_tokens=3, dtype=jnp.bfloat16),
     dict(num_splits=2)),
    ("g3_d128_b32_default_splits", [130, 1, 64], dict(num_q_heads=6, num_kv_heads=2, head_dim=128, block_size=32),
     {}),
    ("g8_splits_cross_blocks", [100, 33], dict(num_q_heads=8, num_kv_heads=1, block_size=32, pad_blocks=1),
     dict(num_splits=5, block_kv=16)),
]


@pytest.mark.parametrize("case_id,contexts,layout,knobs", CASES, ids=[c[0] for c in CASES])
def test_split_kv_matches_reference(case_id, contexts, layout, knobs):
    layout = dict(dict(head_dim=64, block_size=16), **layout)
    case = random_ragged_case(len(case_id), [(min(c, 1), c) for c in contexts], **layout)
    sm_scale = case.q.shape[-1] ** -0.5
    expected = reference_output(case, sm_scale)
    poisoned = poison_unused_slots(case, float("nan"))
    kernel = jax.jit(functools.partial(split_kv_paged_attention, sm_scale=sm_scale, interpret=True, **knobs))
    out = np.asarray(kernel(*poisoned.args()), np.float32)

    valid = case.num_valid_tokens
    assert not np.isnan(out).any()
    assert np.all(out[valid:] == 0), "padding tokens must come out as zeros"
    assert relative_error(out[:valid], expected[:valid]) < TOLERANCE[case.q.dtype]


def test_rejects_prefill_batches():
    case = random_ragged_case(0, [(2, 5)], num_q_heads=2, num_kv_heads=1, head_dim=64, block_size=16)
    with pytest.raises(ValueError, match="decode-only"):
        split_kv_paged_attention(*case.args(), max_query_len=2, sm_scale=1.0, interpret=True)


@pytest.mark.parametrize("num_seqs,max_context,expected", [
    (1, 4096, 64),  # batch 1, long context: split until ~1024 programs (8 KV heads)
    (1, 256, 4),  # ... but no split shorter than one KV tile of 64
    (256, 4096, 1),  # a big batch fills the GPU without splitting
])
def test_default_num_splits(num_seqs, max_context, expected):
    assert default_num_splits(num_seqs, 8, max_context, 64) == expected
