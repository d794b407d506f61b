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
from pallas_kernels.paged_attention.cpu_kernel import cpu_kernel_error, cpu_ragged_paged_attention
from pallas_kernels.paged_attention.testing import (dense_oracle, poison_unused_slots, random_ragged_case,
                                                    reference_output, relative_error)

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
    ("padding_only", [], dict(num_q_heads=4, num_kv_heads=2, pad_seqs=3, pad_tokens=4)),
]


def _attend(case, sm_scale):
    return np.asarray(jax.jit(functools.partial(cpu_ragged_paged_attention, sm_scale=sm_scale))(*case.args()),
                      np.float32)


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


def test_masked_slots_never_reach_the_result():
    case = random_ragged_case(5, [(1, 37), (20, 45), (1, 16), (7, 7)], num_q_heads=6, num_kv_heads=3, head_dim=64,
                              block_size=16, spare_blocks=3)
    expected = reference_output(case, 0.125)
    out = _attend(poison_unused_slots(case, float("nan")), 0.125)
    assert not np.isnan(out).any()
    assert relative_error(out, expected) < 1e-5


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
