"""Attention backends behind one interface: (q, k_pool, v_pool, layer, batch, sm_scale) -> [T, Hq, D].

    reference   plain jnp (pallas_kernels/paged_attention/reference.py): the ground truth, and the CPU path where
                the native kernel cannot be built
    cpu         the native CPU kernel (pallas_kernels/paged_attention/cpu_kernel.cc, an XLA FFI call built at first
                use): reads K/V blocks in place, 2-4x the reference's speed on CPU
    pallas      the Pallas GPU kernels: split-KV for decode-only steps (batch.decode_only, a static flag), the
                ragged kernel otherwise; runs in interpret mode when the default backend is not a GPU (slow: tests)
    auto        pallas on a GPU; elsewhere cpu, or reference (with a warning) where no C++ compiler can build it
"""

from __future__ import annotations

import logging
from typing import Callable

import jax

from jaxllm.model.step_batch import StepBatch
from pallas_kernels.paged_attention import (ragged_paged_attention, ragged_paged_attention_reference,
                                            split_kv_paged_attention)
from pallas_kernels.paged_attention.cpu_kernel import cpu_kernel_error, cpu_ragged_paged_attention

logger = logging.getLogger(__name__)


def reference_attention(q, k_pool, v_pool, layer, batch: StepBatch, sm_scale: float) -> jax.Array:
    return ragged_paged_attention_reference(
        q, k_pool, v_pool, layer, batch.block_tables, batch.context_lens, batch.query_start_loc, sm_scale=sm_scale)


def cpu_attention(q, k_pool, v_pool, layer, batch: StepBatch, sm_scale: float) -> jax.Array:
    return cpu_ragged_paged_attention(
        q, k_pool, v_pool, layer, batch.block_tables, batch.context_lens, batch.query_start_loc, sm_scale=sm_scale)


def pallas_attention(q, k_pool, v_pool, layer, batch: StepBatch, sm_scale: float) -> jax.Array:
    """The ragged kernel's query tiles take their default size: every chunk may be as long as the step."""
    kernel = split_kv_paged_attention if batch.decode_only else ragged_paged_attention
    max_query_len = 1 if batch.decode_only else q.shape[0]
    return kernel(q, k_pool, v_pool, layer, batch.block_tables, batch.context_lens, batch.query_start_loc,
                  max_query_len=max_query_len, sm_scale=sm_scale, interpret=not _on_gpu())


ATTENTION_BACKENDS: dict[str, Callable] = {"reference": reference_attention, "cpu": cpu_attention,
                                           "pallas": pallas_attention}


def resolve_attention(name: str) -> str:
    """The backend `name` stands for: "auto" is "pallas" on a GPU, else "cpu" where its kernel builds, else
    "reference". Asking for "cpu" where it cannot be built is an error that says why."""
    if name == "auto":
        name = "pallas" if _on_gpu() else _cpu_or_reference()
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {name!r} is unknown; choose one of {sorted(ATTENTION_BACKENDS)} or 'auto'")
    if name == "cpu" and (error := cpu_kernel_error()) is not None:
        raise ValueError(f"attention backend 'cpu' cannot run here: {error}")
    return name


def get_attention(name: str) -> Callable:
    return ATTENTION_BACKENDS[resolve_attention(name)]


def _cpu_or_reference() -> str:
    error = cpu_kernel_error()
    if error is None:
        return "cpu"
    logger.warning("the native CPU attention kernel cannot be built, so attention runs the slower jnp reference: %s",
                   error)
    return "reference"


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"
