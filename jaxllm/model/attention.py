"""Attention backends behind one interface: (q, k_pool, v_pool, layer, batch, sm_scale) -> [T, Hq, D], with two
static options every backend implements (None: off; the semantics of Hugging Face's Mistral / Gemma 2 / Gemma 3):

    sliding_window   W >= 1: the query at position p sees key j iff j <= p and p - j < W
    logit_softcap    c > 0: scores = c * tanh(scores * sm_scale / c) before masking (scale first, then cap)

    reference   plain jnp (pallas_kernels/paged_attention/reference.py): the ground truth, and the CPU path where
                the native kernel cannot be built
    cpu         the native CPU kernel (pallas_kernels/paged_attention/cpu_kernel.cc, an XLA FFI call built at first
                use): reads K/V blocks in place, 2-4x the reference's speed on CPU
    pallas      the Pallas GPU kernels: split-KV for decode-only steps (batch.decode_only, a static flag), the
                ragged kernel otherwise; in interpret mode where there is no GPU (slow: tests)

model/kernels.py chooses one (Kernels.attention); `attend` runs it.
"""

from __future__ import annotations

import jax

from jaxllm.model.kernels import Kernels
from jaxllm.model.step_batch import StepBatch
from pallas_kernels.paged_attention import (ragged_paged_attention, ragged_paged_attention_reference,
                                            split_kv_paged_attention)
from pallas_kernels.paged_attention.cpu_kernel import cpu_ragged_paged_attention
from pallas_kernels.paged_attention.reference import check_attention_options


def attend(kernels: Kernels, q, k_pool, v_pool, layer, batch: StepBatch, sm_scale: float, *,
           sliding_window: int | None = None, logit_softcap: float | None = None) -> jax.Array:
    """q [T, Hq, D] attending over the pools' layer `layer` with the implementation `kernels` names -> [T, Hq, D].
    sliding_window, logit_softcap: static Python values (module docstring); a layer with other values is another
    program. Pallas: the ragged kernel's query tiles take their default size (every chunk may be as long as the
    step)."""
    check_attention_options(sliding_window, logit_softcap)
    args = (q, k_pool, v_pool, layer, batch.block_tables, batch.context_lens, batch.query_start_loc)
    options = dict(sm_scale=sm_scale, sliding_window=sliding_window, logit_softcap=logit_softcap)
    if kernels.attention == "reference":
        return ragged_paged_attention_reference(*args, **options)
    if kernels.attention == "cpu":
        return cpu_ragged_paged_attention(*args, **options)
    kernel = split_kv_paged_attention if batch.decode_only else ragged_paged_attention
    return kernel(*args, max_query_len=1 if batch.decode_only else q.shape[0], interpret=kernels.interpret,
                  **options)
