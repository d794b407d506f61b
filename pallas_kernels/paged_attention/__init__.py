"""Ragged paged attention over the KV block pool."""

from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference

__all__ = ["ragged_paged_attention_reference"]
