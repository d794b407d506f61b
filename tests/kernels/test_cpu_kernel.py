"""The native CPU attention kernel (cpu_kernel.cc) against the jnp reference and the float64 dense oracle.

The kernel cuts its work into (sequence, KV head, query tile) items run longest first on several threads; the
cases cross tile and block boundaries, mix decode rows and prompt chunks in any order, put padded sequences in the
middle and padding tokens at the end. A pool poisoned with NaN outside the sequences' slots shows that no masked
key reaches a result; inputs that break the contract are errors, not reads outside the pool.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.compile_counter import CompileCounter
from jaxllm.loaders.cpu_dtype import cpu_flags
from pallas_kernels.amx_matmul.cpu import amx_matmul_error
from pallas_kernels.paged_attention.cpu_kernel import (cpu_kernel_error, cpu_ragged_paged_attention,
                                                       prompt_tiles_on_amx)
from pallas_kernels.paged_attention.testing import (dense_oracle, poison_keys_before, poison_unused_slots,
                                                    random_ragged_case, reference_output, relative_error)

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel")
TILE = 32  # cpu_kernel.cc's kQueryTile
CASES = [
    ("decode_many_rows", [(1, 1 + 7 * i) for i in range(37)], dict(num_q_heads=8, num_kv_heads=2)),
    ("decode_long_contexts", [(1, 16 * 9 + 5), (1, 3), (1, 16 * 4)], dict(num_q_heads=9, num_kv_heads=3)),
    ("prompts_many_tiles", [(TILE * 2 + 7, TILE * 2 + 7), (2, 2), (TILE, 40)], dict(num_q_heads=4, num_kv_heads=4)),
    ("mixed_any_order", [(9, 41), (1, 30), (0, 0), (16, 16), (1, 1), (5, 73), (1, 77)],
     dict(num_q_heads=6, num_kv_heads=2, head_dim=32, pad_seqs=2, pad_tokens=5)),
    ("chunk_after_prefix", [(40, 16 * 12 + 1), (1, 2)], dict(num_q_heads=8, num_kv_heads=1, block_size=32)),
    ("head_dim_128", [(3, 20), (1, 50)], dict(num_q_heads=4, num_kv_heads=2, head_dim=128)),
    ("bf16", [(3, 50), (1, 1), (12, 70)], dict(num_q_heads=8, num_kv_heads=2, dtype=jnp.bfloat16)),
    ("head_dim_256_bf16", [(1, 33), (4, 47)], dict(num_q_heads=4, num_kv_heads=1, head_dim=256, dtype=jnp.bfloat16)),
    ("padding_only", [], dict(num_q_heads=4, num_kv_heads=2, pad_seqs=3, pad_tokens=4)),
    # prompt tiles of 16 query vectors or more take the lanes path: groups of 16 that split a token's query heads,
    # a partial last group, a decode row beside them, a chunk after a cached prefix
    ("prompt_lanes_g3", [(37, 37), (6, 50), (1, 9), (50, 83)], dict(num_q_heads=9, num_kv_heads=3)),
    ("prompt_lanes_d128_bf16", [(11, 11), (23, 40)],
     dict(num_q_heads=6, num_kv_heads=2, head_dim=128, dtype=jnp.bfloat16)),
    # decode rows attend their G query vectors together, up to 4 (head size 64), 2 (128) or 1 (256) at a time:
    # G = 7 in groups of 4 and 3, G = 3 at 128 in 2 and 1, G = 1; full and partial blocks
    ("decode_rows_g7", [(1, 40), (1, 16), (1, 17), (1, 1)], dict(num_q_heads=7, num_kv_heads=1)),
    ("decode_rows_g3_d128_bf16", [(1, 33), (1, 70), (1, 5)],
     dict(num_q_heads=6, num_kv_heads=2, head_dim=128, dtype=jnp.bfloat16)),
    ("decode_rows_g1", [(1, 20), (1, 48)], dict(num_q_heads=2, num_kv_heads=2)),
    # prompt tiles over a bfloat16 pool take AMX tiles where the CPU has them (else the lanes path): G = 3 splitting
    # groups, partial last groups and blocks, chunks after a prefix, head sizes 64, 128, 256
    ("prompt_tiles_g3_bf16", [(37, 37), (6, 50), (1, 9), (50, 83)],
     dict(num_q_heads=9, num_kv_heads=3, dtype=jnp.bfloat16)),
    ("prompt_tiles_d256_bf16", [(5, 37), (40, 66)], dict(num_q_heads=4, num_kv_heads=1, head_dim=256,
                                                         dtype=jnp.bfloat16)),
]


def _attend(case, sm_scale, **options):
    attend = jax.jit(functools.partial(cpu_ragged_paged_attention, sm_scale=sm_scale, **options))
    return np.asarray(attend(*case.args()), np.float32)


def test_the_kernel_builds_here():
    assert cpu_kernel_error() is None


@pytest.mark.parametrize("case_id,seqs,layout", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference_and_oracle(case_id, seqs, layout):
    layout = dict(dict(head_dim=64, block_size=16), **layout)
    case = random_ragged_case(len(case_id), seqs, **layout)
    sm_scale = case.q.shape[-1] ** -0.5
    out = _attend(case, sm_scale)
    valid = case.num_valid_tokens
    assert out.dtype == np.float32 and out.shape == case.q.shape
    assert np.all(out[valid:] == 0), "padding tokens must come out as zeros"
    tolerance = 2e-2 if case.q.dtype == jnp.bfloat16 else 1e-5
    assert relative_error(out, reference_output(case, sm_scale)) < tolerance
    if valid:
        assert relative_error(out[:valid], dense_oracle(case, sm_scale)[:valid]) < tolerance


def test_bfloat16_queries_get_their_float32_result_rounded():
    """With bfloat16 queries the kernel writes bfloat16 itself: each value its float32 result rounded to nearest
    even (as astype rounds), padding tokens zeros; decode rows, prompt lanes and small tiles alike."""
    case = random_ragged_case(3, [(1, 37), (20, 45), (3, 19), (1, 16)], num_q_heads=6, num_kv_heads=2, head_dim=64,
                              block_size=16, dtype=jnp.bfloat16, pad_tokens=3)
    attend = jax.jit(functools.partial(cpu_ragged_paged_attention, sm_scale=0.3))
    out = attend(*case.args())
    wide = attend(*case._replace(q=case.q.astype(jnp.float32)).args())
    assert out.dtype == jnp.bfloat16 and wide.dtype == jnp.float32
    assert np.array_equal(np.asarray(out).view(np.uint16), np.asarray(wide.astype(jnp.bfloat16)).view(np.uint16))
    assert np.all(np.asarray(out, np.float32)[case.num_valid_tokens:] == 0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_masked_slots_never_reach_the_result(dtype):
    case = random_ragged_case(5, [(1, 37), (20, 45), (1, 16), (7, 7)], num_q_heads=6, num_kv_heads=3, head_dim=64,
                              block_size=16, spare_blocks=3, dtype=dtype)
    case = case._replace(q=case.q.astype(jnp.float32))
    expected = reference_output(case, 0.125)
    out = _attend(poison_unused_slots(case, float("nan")), 0.125)
    assert not np.isnan(out).any()
    assert relative_error(out, expected) < 1e-5


def test_a_bfloat16_pool_attends_as_its_values_in_float32():
    """A bfloat16 pool's keys and values are exact in float32: every path (decode rows, prompt tiles on AMX, where
    the queries and weights go in as bfloat16 pairs of a value and its remainder) gives the float32 pool's result
    within 1e-5, not merely within bfloat16's rounding (~4e-3)."""
    case = random_ragged_case(8, [(1, 70), (45, 45), (20, 99), (3, 17)], num_q_heads=9, num_kv_heads=3, head_dim=64,
                              block_size=16, dtype=jnp.bfloat16)
    case = case._replace(q=case.q.astype(jnp.float32))
    wide = case._replace(k_pool=case.k_pool.astype(jnp.float32), v_pool=case.v_pool.astype(jnp.float32))
    assert relative_error(_attend(case, 0.4), _attend(wide, 0.4)) < 1e-5


def test_prompt_tiles_run_on_amx_wherever_the_matmul_does():
    """The attention kernel takes AMX tiles on exactly the machines where the tiled matmul runs on AMX (where the
    CPU has AVX512-BF16 but no AMX, the matmul runs and attention takes its AVX-512 lanes)."""
    assert prompt_tiles_on_amx() == (amx_matmul_error() is None and "amx_bf16" in cpu_flags())


def test_one_program_serves_every_mix():
    mixes = [[(1, 200)] * 6, [(30, 30), (1, 5), (1, 9)], [(2, 180), (17, 17)], [(1, 1)]]
    cases = []
    for seed, seqs in enumerate(mixes):
        tokens, blocks = sum(q for q, _ in seqs), max(-(-c // 16) for _, c in seqs)
        cases.append(random_ragged_case(seed, seqs, num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
                                        pad_seqs=6 - len(seqs), pad_tokens=40 - tokens, pad_blocks=16 - blocks,
                                        spare_blocks=100 - sum(-(-c // 16) for _, c in seqs)))
    attend = jax.jit(functools.partial(cpu_ragged_paged_attention, sm_scale=0.125))
    with CompileCounter() as compiles:
        outs = [np.asarray(attend(*case.args())) for case in cases]
    assert compiles.count == 1
    for case, out in zip(cases, outs):
        assert relative_error(out, reference_output(case, 0.125)) < 1e-5


@pytest.mark.parametrize("field,value,message", [
    ("block_tables", 10_000, r"block_tables\[0, 1\] = 10000 is not a pool block"),
    ("block_tables", -1, r"block_tables\[0, 1\] = -1 is not a pool block"),
    ("context_lens", 16 * 40, r"context_lens\[0\] = 640 is below its query length or beyond its block table"),
    ("query_start_loc", 99, "query_start_loc runs outside the query tokens"),
])
def test_inputs_outside_the_contract_are_errors(field, value, message):
    case = random_ragged_case(1, [(2, 20), (1, 9)], num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16)
    bad = {"block_tables": lambda a: a.at[0, 1].set(value), "context_lens": lambda a: a.at[0].set(value),
           "query_start_loc": lambda a: a.at[-1].set(value)}[field]
    case = case._replace(**{field: bad(getattr(case, field))})
    with pytest.raises(Exception, match=message):
        _attend(case, 0.125)


# Sliding windows and soft-capping against the reference and the oracle: windows below, at and above the contexts,
# not multiples of the block (16); decode rows beside prompt chunks after cached prefixes, across query tiles; head
# sizes 64, 128 and 256 (the unrolled paths) and 32 (the generic one); bfloat16 pools.
OPTION_CASES = [
    ("w5_mixed", [(1, 40), (9, 41), (1, 3), (20, 90)], dict(sliding_window=5), {}),
    ("w16_softcap_many_tiles", [(TILE * 2 + 7, 100), (1, 16), (16, 16)], dict(sliding_window=16, logit_softcap=2.0),
     {}),
    ("w70_at_a_context_d128", [(1, 70), (5, 70), (1, 150), (0, 0)], dict(sliding_window=70),
     dict(head_dim=128, pad_tokens=3)),
    ("w100_above_contexts_d32_b32", [(1, 40), (12, 60)], dict(sliding_window=100), dict(head_dim=32, block_size=32)),
    ("softcap_d256", [(1, 50), (7, 30)], dict(logit_softcap=2.0), dict(head_dim=256)),
    ("w37_softcap_d256", [(1, 120), (40, 66)], dict(sliding_window=37, logit_softcap=30.0), dict(head_dim=256)),
    ("w21_softcap_bf16", [(1, 100), (13, 77)], dict(sliding_window=21, logit_softcap=5.0), dict(dtype=jnp.bfloat16)),
    ("w9_lanes_g3_chunk", [(40, 120), (17, 17), (1, 60)], dict(sliding_window=9),
     dict(num_q_heads=9, num_kv_heads=3)),
    ("w19_tiles_g3_chunk_bf16", [(40, 120), (17, 17), (1, 60)], dict(sliding_window=19),
     dict(num_q_heads=9, num_kv_heads=3, dtype=jnp.bfloat16)),
]


@pytest.mark.parametrize("case_id,seqs,options,layout", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_options_match_reference_and_oracle(case_id, seqs, options, layout):
    layout = dict(dict(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16), **layout)
    case = random_ragged_case(len(case_id), seqs, **layout)
    sm_scale = case.q.shape[-1] ** -0.5 * 4  # scores large enough for the cap to bite
    out = _attend(case, sm_scale, **options)
    valid = case.num_valid_tokens
    assert np.all(out[valid:] == 0), "padding tokens must come out as zeros"
    tolerance = 2e-2 if case.q.dtype == jnp.bfloat16 else 1e-5
    assert relative_error(out, reference_output(case, sm_scale, **options)) < tolerance
    assert relative_error(out[:valid], dense_oracle(case, sm_scale, **options)[:valid]) < tolerance


def test_keys_before_the_window_never_reach_the_result():
    """NaN in the blocks wholly before each item's window never reaches the result: keys outside a query's window
    are left out, not weighted by zero."""
    window = 20
    case = random_ragged_case(6, [(9, 200), (1, 150)], num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16)
    poisoned = poison_keys_before(case, 0, (200 - 9 - window + 1) // 16 * 16)
    poisoned = poison_keys_before(poisoned, 1, (150 - window) // 16 * 16)
    out = _attend(poisoned, 0.2, sliding_window=window)
    assert not np.isnan(out).any()
    assert relative_error(out, reference_output(case, 0.2, sliding_window=window)) < 1e-5


@pytest.mark.parametrize("options,argument", [(dict(sliding_window=0), "sliding_window"),
                                              (dict(logit_softcap=-2.0), "logit_softcap")])
def test_bad_options_are_rejected(options, argument):
    case = random_ragged_case(0, [(1, 5)], num_q_heads=2, num_kv_heads=1, head_dim=32, block_size=16)
    with pytest.raises(ValueError, match=argument):
        _attend(case, 1.0, **options)
