"""The split-KV (flash-decoding) kernel (interpret mode) against the jnp reference on decode-only steps, its stored
partials against a per-split float64 oracle, and the properties of its split rule."""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import split_kv_paged_attention
from pallas_kernels.paged_attention.reference import MASK_VALUE
from pallas_kernels.paged_attention.split_kv import (MIN_SPLIT_KEYS, TARGET_PROGRAMS, _partials, default_num_splits,
                                                     partial_bytes, split_plan)
from pallas_kernels.paged_attention.testing import (TOLERANCE, poison_keys_before, poison_unused_slots,
                                                    random_ragged_case, reference_output, relative_error)

# Contexts against splits of 32 keys (3 splits of a 96-key table, block_kv 16): 0 (a padded sequence in place),
# 1, exact multiples of the split (32, 64, the whole table 96), shorter than one split (17), a ragged tail (95).
MIXED = [0, 1, 32, 17, 64, 96, 95]
GROUPS = [(2, 2), (4, 2), (8, 2), (8, 1), (6, 2)]  # (Hq, Hkv): G = 1 (MHA), 2, 4, 8 and a non-power-of-two 3

# (id, context lengths (one query token each; 0: a padded sequence), layout overrides, kernel knobs)
CASES = [
    ("mha_padded_bf16", [40, 7], dict(num_q_heads=2, num_kv_heads=2, pad_seqs=2, pad_tokens=3, dtype=jnp.bfloat16),
     dict(num_splits=2)),
    ("g3_d128_b32_one_split", [130, 1, 64], dict(num_q_heads=6, num_kv_heads=2, head_dim=128, block_size=32), {}),
    ("g8_splits_cross_blocks", [100, 33], dict(num_q_heads=8, num_kv_heads=1, block_size=32, pad_blocks=1),
     dict(num_splits=5, block_kv=16)),
    ("g4_default_splits_600", [600, 0, 257], dict(num_q_heads=4, num_kv_heads=1), {}),  # default plan: 2 x 320
]


def run_kernel(case, sm_scale, **knobs) -> np.ndarray:
    """The kernel, jitted, on the case with every unused pool slot (and the other layer) set to NaN."""
    kernel = jax.jit(functools.partial(split_kv_paged_attention, sm_scale=sm_scale, interpret=True, **knobs))
    return np.asarray(kernel(*poison_unused_slots(case, float("nan")).args()), np.float32)


def check_against_reference(case, out: np.ndarray, sm_scale: float, **options) -> None:
    expected = reference_output(case, sm_scale, **options)
    valid = case.num_valid_tokens
    assert not np.isnan(out).any()
    assert np.all(out[valid:] == 0), "padding tokens must come out as zeros"
    assert relative_error(out[:valid], expected[:valid]) < TOLERANCE[case.q.dtype]


@pytest.mark.parametrize("dtype", [pytest.param(jnp.float32, id="f32"),
                                   pytest.param(jnp.bfloat16, id="bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("heads", GROUPS, ids=[f"g{hq // hkv}" for hq, hkv in GROUPS])
def test_mixed_contexts_match_reference(heads, dtype):
    num_q_heads, num_kv_heads = heads
    case = random_ragged_case(num_q_heads + 10 * num_kv_heads, [(min(c, 1), c) for c in MIXED],
                              num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=32, block_size=16,
                              dtype=dtype, pad_seqs=1, pad_tokens=1)
    assert split_plan(len(MIXED) + 1, num_kv_heads, 96, 16, 3) == (3, 32)
    check_against_reference(case, run_kernel(case, 32 ** -0.5, num_splits=3, block_kv=16), 32 ** -0.5)


@pytest.mark.parametrize("case_id,contexts,layout,knobs", CASES, ids=[c[0] for c in CASES])
def test_split_kv_matches_reference(case_id, contexts, layout, knobs):
    layout = dict(dict(head_dim=64, block_size=16), **layout)
    case = random_ragged_case(len(case_id), [(min(c, 1), c) for c in contexts], **layout)
    sm_scale = case.q.shape[-1] ** -0.5
    check_against_reference(case, run_kernel(case, sm_scale, **knobs), sm_scale)


def test_layer_as_python_int_or_traced():
    """The model's unrolled layer loop passes Python ints, a scanned one a traced int32: both read that layer."""
    case = random_ragged_case(3, [(1, 50), (1, 9)], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16)
    poisoned = poison_unused_slots(case, float("nan"))  # the other layer is all NaN
    layer = int(case.layer)
    knobs = dict(sm_scale=0.2, num_splits=2, block_kv=16, interpret=True)
    rest = poisoned.args()[4:]
    with_int = jax.jit(lambda q, k, v, *r: split_kv_paged_attention(q, k, v, layer, *r, **knobs))
    traced = jax.jit(functools.partial(split_kv_paged_attention, **knobs))
    expected = reference_output(case, 0.2)
    for out in (with_int(*poisoned.args()[:3], *rest), traced(*poisoned.args()[:3], jnp.int32(layer), *rest)):
        assert relative_error(out, expected) < TOLERANCE[case.q.dtype]


def split_oracle(case, sm_scale: float, num_splits: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """Each split's partial in float64 numpy -> (o [S, Hkv, NS, G, D], lse [S, Hkv, NS, G]).

    o is the softmax-weighted mean of the split's values, lse = log2 sum_j exp(score_j) (base 2, as the kernel
    stores it); a split with no key of its context (or of a sequence without a query) gives 0 and MASK_VALUE.
    """
    q = np.asarray(case.q, np.float64)
    k_pool, v_pool = (np.asarray(p[int(case.layer)], np.float64) for p in (case.k_pool, case.v_pool))
    tables, ctx, starts = (np.asarray(a) for a in (case.block_tables, case.context_lens, case.query_start_loc))
    num_seqs, (num_kv_heads, block_size, head_dim) = tables.shape[0], k_pool.shape[1:]
    group = q.shape[1] // num_kv_heads
    o = np.zeros((num_seqs, num_kv_heads, num_splits, group, head_dim))
    lse = np.full((num_seqs, num_kv_heads, num_splits, group), MASK_VALUE)
    for s, h, k in itertools.product(range(num_seqs), range(num_kv_heads), range(num_splits)):
        keys = np.arange(k * split, min((k + 1) * split, ctx[s] if starts[s + 1] > starts[s] else 0))
        if keys.size == 0:
            continue
        kk = k_pool[tables[s, keys // block_size], h, keys % block_size]  # [K, D]
        vv = v_pool[tables[s, keys // block_size], h, keys % block_size]
        scores = q[starts[s], h * group:(h + 1) * group] @ kk.T * sm_scale  # [G, K]
        top = scores.max(axis=1, keepdims=True)
        p = np.exp(scores - top)
        o[s, h, k] = p @ vv / p.sum(axis=1, keepdims=True)
        lse[s, h, k] = (top[:, 0] + np.log(p.sum(axis=1))) / math.log(2)
    return o, lse


@pytest.mark.parametrize("heads", [(8, 2), (2, 2)], ids=["g4", "g1"])
def test_partials_hold_exactly_the_real_rows_of_every_split(heads):
    """Every stored row is a real query head's partial for its own split: padding rows (GP - G of them) stored in
    place of real ones, a split left unstored (NaN in interpret mode) or merged into its neighbour all fail."""
    num_q_heads, num_kv_heads = heads
    case = random_ragged_case(5, [(min(c, 1), c) for c in MIXED], num_q_heads=num_q_heads,
                              num_kv_heads=num_kv_heads, head_dim=32, block_size=16, pad_seqs=1, pad_tokens=1)
    num_splits, split = split_plan(len(MIXED) + 1, num_kv_heads, 96, 16, 3)
    poisoned = poison_unused_slots(case, float("nan"))
    partials = jax.jit(functools.partial(_partials, num_splits=num_splits, split=split, sm_scale=0.3, block_kv=16,
                                         num_warps=4, num_stages=2, interpret=True))
    o_part, lse = (np.asarray(a) for a in partials(*poisoned.args()))
    want_o, want_lse = split_oracle(case, 0.3, num_splits, split)
    assert o_part.shape == want_o.shape and lse.shape == want_lse.shape  # [S, Hkv, NS, G, (D)]: no padding rows
    np.testing.assert_allclose(o_part, want_o, rtol=0, atol=2e-5 * np.abs(want_o).max())
    empty = want_lse == MASK_VALUE
    assert np.array_equal(lse == np.float32(MASK_VALUE), empty)
    np.testing.assert_allclose(lse[~empty], want_lse[~empty], rtol=0, atol=1e-4)


def test_rejects_prefill_batches():
    case = random_ragged_case(0, [(2, 5)], num_q_heads=2, num_kv_heads=1, head_dim=64, block_size=16)
    with pytest.raises(ValueError, match="decode-only"):
        split_kv_paged_attention(*case.args(), max_query_len=2, sm_scale=1.0, interpret=True)


@pytest.mark.parametrize("num_seqs,max_context,expected", [
    (1, 8192, 32),  # batch 1, long context: the 256-key minimum binds before the program target (66 splits)
    (1, 256, 1),  # a context of one minimal split is not split
    (8, 8192, 8),  # 64 programs x 8 splits = 512, nearest the 528 target
    (64, 4096, 1),  # 512 programs already: splitting would make a second wave
    (256, 1024, 1),
])
def test_default_num_splits_examples(num_seqs, max_context, expected):
    assert default_num_splits(num_seqs, 8, max_context, 64) == expected


PLAN_GRID = list(itertools.product([1, 2, 3, 8, 33, 64, 100, 256, 1000], [1, 2, 8],
                                   [16, 100, 256, 300, 512, 513, 1000, 4096, 8192, 10000, 32768, 131072],
                                   [16, 32, 64, 128]))


def test_split_plan_properties():
    """Over a grid of batches, KV heads, table widths and tile sizes, the default plan
    - covers every key of a full context with whole KV tiles and leaves no split empty at full length,
    - never cuts a split shorter than MIN_SPLIT_KEYS (nor than one tile),
    - splits until the grid holds at least half of TARGET_PROGRAMS, or of what that minimum allows,
    - and, once split, does not go far past TARGET_PROGRAMS (at most 1.5x: one wave, no long tail)."""
    for num_seqs, num_kv_heads, max_context, block_kv in PLAN_GRID:
        num_splits, split = split_plan(num_seqs, num_kv_heads, max_context, block_kv)
        where = (num_seqs, num_kv_heads, max_context, block_kv, num_splits, split)
        programs = num_seqs * num_kv_heads
        assert split % block_kv == 0 and (num_splits - 1) * split < max_context <= num_splits * split, where
        assert num_splits == 1 or split >= max(MIN_SPLIT_KEYS, block_kv), where
        most = max(1, max_context // max(MIN_SPLIT_KEYS, block_kv))  # splits the minimum length allows
        assert programs * num_splits >= min(TARGET_PROGRAMS, programs * most) / 2, where
        assert num_splits == 1 or programs * num_splits <= 1.5 * TARGET_PROGRAMS, where


@pytest.mark.parametrize("group,head_dim", [(1, 64), (4, 128), (8, 128), (8, 64)])
def test_partials_stay_a_small_fraction_of_the_kv_bytes(group, head_dim):
    """With 16-bit pools and every context at the table's width, the partials (stored, then read by the merge) stay
    under 1/15 of the K/V bytes the kernel reads, whatever the batch: short splits would break this."""
    for num_seqs, num_kv_heads, max_context, block_kv in PLAN_GRID:
        num_splits, split = split_plan(num_seqs, num_kv_heads, max_context, block_kv)
        if num_splits == 1:
            continue  # unsplit: one partial per sequence and KV head, which is the output itself
        kv_bytes = num_seqs * num_kv_heads * max_context * head_dim * 2 * 2  # K and V, bf16
        traffic = 2 * partial_bytes(num_seqs, num_kv_heads, num_splits, group, head_dim)
        assert traffic <= kv_bytes / 15, (num_seqs, num_kv_heads, max_context, block_kv, num_splits)


# Decode steps with sliding windows and soft-capping: windows below, at and above the contexts, not multiples of the
# block (16) or of block_kv; several splits across the window; head sizes 64, 128, 256.
OPTION_CASES = [
    ("w5_splits", [40, 3, 0, 90], dict(sliding_window=5), {}, dict(num_splits=3, block_kv=16)),
    ("w40_softcap_splits", [130, 1, 64, 41], dict(sliding_window=40, logit_softcap=2.0), {},
     dict(num_splits=3, block_kv=16)),
    ("w64_at_a_context_d128", [64, 200], dict(sliding_window=64), dict(head_dim=128, block_size=32), {}),
    ("w300_above_contexts", [40, 250], dict(sliding_window=300), {}, dict(num_splits=2)),
    ("softcap_d256_g3", [77, 1], dict(logit_softcap=3.0), dict(head_dim=256, num_q_heads=6), {}),
    ("w33_softcap_d256_bf16", [120, 30], dict(sliding_window=33, logit_softcap=30.0),
     dict(head_dim=256, dtype=jnp.bfloat16), dict(num_splits=2, block_kv=16)),
]


@pytest.mark.parametrize("case_id,contexts,options,layout,knobs", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_options_match_reference(case_id, contexts, options, layout, knobs):
    layout = dict(dict(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16, pad_tokens=1), **layout)
    case = random_ragged_case(len(case_id), [(min(c, 1), c) for c in contexts], **layout)
    sm_scale = case.q.shape[-1] ** -0.5 * 4  # scores large enough for the cap to bite
    out = run_kernel(case, sm_scale, **options, **knobs)
    expected = reference_output(case, sm_scale, **options)
    valid = case.num_valid_tokens
    assert not np.isnan(out).any() and np.all(out[valid:] == 0)
    assert relative_error(out[:valid], expected[:valid]) < TOLERANCE[case.q.dtype]


def test_window_splits_only_the_window():
    """The splits cover the window, not the context: with the window's tiles alone in two splits, NaN in every
    key before them never reaches the result."""
    window, block_kv, context = 40, 16, 300
    case = random_ragged_case(4, [(1, context), (1, 20)], num_q_heads=4, num_kv_heads=1, head_dim=32, block_size=16)
    unread = (context - window) // block_kv * block_kv
    out = run_kernel(poison_keys_before(case, 0, unread), 0.2, sliding_window=window, num_splits=2,
                     block_kv=block_kv)
    check_against_reference(case, out, 0.2, sliding_window=window)
