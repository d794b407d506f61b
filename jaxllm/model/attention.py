"""Attention backends behind one interface: (q, k_pool, v_pool, layer, batch, sm_scale) -> [T, Hq, D]."""

from __future__ import annotations

from typing import Callable

import jax

from jaxllm.model.step_batch import StepBatch
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference


def reference_attention(q, k_pool, v_pool, layer, batch: StepBatch, sm_scale: float) -> jax.Array:
    return ragged_paged_attention_reference(
        q, k_pool, v_pool, layer, batch.block_tables, batch.context_lens, batch.query_start_loc,
        max_query_len=batch.max_query_len, sm_scale=sm_scale)


ATTENTION_BACKENDS: dict[str, Callable] = {"reference": reference_attention}


def get_attention(name: str) -> Callable:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown; choose one of {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]
