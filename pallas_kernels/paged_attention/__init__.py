"""Ragged paged attention over the KV block pool: the jnp reference and the Pallas GPU kernels tested against it."""

from pallas_kernels.paged_attention.kernel import ragged_paged_attention
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference
from pallas_kernels.paged_attention.split_kv import split_kv_paged_attention

__all__ = ["ragged_paged_attention", "ragged_paged_attention_reference", "split_kv_paged_attention"]
