"""`attend` hands sliding_window and logit_softcap to every attention implementation: each, picked through
Kernels, matches the float64 oracle on a step of decode rows and prompt chunks (and on a decode-only step, which
sends Pallas to its split-KV kernel); bad values are errors naming the argument, whichever implementation runs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.model.attention import attend
from jaxllm.model.kernels import Kernels
from jaxllm.model.step_batch import StepBatch
from pallas_kernels.paged_attention.testing import dense_oracle, random_ragged_case, relative_error

OPTIONS = dict(sliding_window=11, logit_softcap=3.0)
IMPLEMENTATIONS = [Kernels(attention="reference"), Kernels(attention="cpu"),
                   Kernels(attention="pallas", interpret=True)]


def _batch(case, decode_only: bool) -> StepBatch:
    num_tokens = case.q.shape[0]
    unused = jnp.zeros(num_tokens, jnp.int32)  # [T]: attention reads none of the token arrays
    return StepBatch(token_ids=unused, positions=unused, slot_mapping=unused, block_tables=case.block_tables,
                     context_lens=case.context_lens, query_start_loc=case.query_start_loc,
                     logits_indices=unused[:1], decode_only=decode_only)


@pytest.mark.parametrize("decode_only", [False, True], ids=["mixed", "decode_only"])
@pytest.mark.parametrize("kernels", IMPLEMENTATIONS, ids=[k.attention for k in IMPLEMENTATIONS])
def test_every_implementation_applies_the_options(kernels, decode_only):
    seqs = [(1, 40), (1, 7)] if decode_only else [(1, 40), (9, 30), (1, 7)]
    case = random_ragged_case(1, seqs, num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16)
    sm_scale = 0.5
    run = jax.jit(functools.partial(attend, kernels, sm_scale=sm_scale, **OPTIONS))
    out = run(case.q, case.k_pool, case.v_pool, case.layer, _batch(case, decode_only))
    expected = dense_oracle(case, sm_scale, **OPTIONS)
    assert relative_error(out, expected) < 1e-5
    assert relative_error(expected, dense_oracle(case, sm_scale)) > 1e-2  # the options change this case's result


@pytest.mark.parametrize("options,argument", [(dict(sliding_window=0), "sliding_window"),
                                              (dict(sliding_window=-4), "sliding_window"),
                                              (dict(logit_softcap=0.0), "logit_softcap"),
                                              (dict(logit_softcap=float("inf")), "logit_softcap")])
@pytest.mark.parametrize("kernels", IMPLEMENTATIONS, ids=[k.attention for k in IMPLEMENTATIONS])
def test_bad_options_name_the_argument(kernels, options, argument):
    case = random_ragged_case(0, [(1, 5)], num_q_heads=2, num_kv_heads=1, head_dim=32, block_size=16)
    with pytest.raises(ValueError, match=argument):
        attend(kernels, case.q, case.k_pool, case.v_pool, case.layer, _batch(case, True), 1.0, **options)
