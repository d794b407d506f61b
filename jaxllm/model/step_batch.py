"""StepBatch: the flat arrays of one ragged forward step (prefill chunks and decode tokens mixed).

Built on the host with numpy and already padded to bucket sizes, so the jitted forward only sees a few shapes.

    token_ids       [T]       tokens of all sequences back to back; padding after query_start_loc[S]
    positions       [T]       position of each token in its sequence
    slot_mapping    [T]       pool slot (block * B + offset) where each token's K/V is written; padding -> null block
    block_tables    [S, MB]   each sequence's block ids in order; padding -> null block
    context_lens    [S]       tokens of each sequence in the pool after this step (cached + new); 0 for padding
    query_start_loc [S+1]     sequence s owns tokens query_start_loc[s]:query_start_loc[s+1]
    logits_indices  [R]       which tokens' logits to return
    max_query_len   static    upper bound of the per-sequence query length (a bucket)
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np
from flax import struct

from jaxllm.model.kv_cache import NULL_BLOCK


@struct.dataclass
class StepBatch:
    token_ids: jax.Array
    positions: jax.Array
    slot_mapping: jax.Array
    block_tables: jax.Array
    context_lens: jax.Array
    query_start_loc: jax.Array
    logits_indices: jax.Array
    max_query_len: int = struct.field(pytree_node=False)


@dataclasses.dataclass
class SequenceChunk:
    """Host description of one sequence's share of a step."""

    token_ids: Sequence[int]  # the new tokens this step computes
    num_cached: int  # tokens already in the pool before this step
    block_table: Sequence[int]  # block ids covering at least num_cached + len(token_ids) tokens
    want_logits: str = "last"  # "last" | "all" | "none"


def build_step_batch(
    chunks: Sequence[SequenceChunk],
    block_size: int,
    *,
    num_tokens: int | None = None,
    num_seqs: int | None = None,
    max_blocks: int | None = None,
    max_query_len: int | None = None,
    num_logits: int | None = None,
) -> StepBatch:
    """Pack chunks into numpy arrays padded to the given sizes (defaults: exactly what the chunks need)."""
    q_lens = [len(c.token_ids) for c in chunks]
    num_tokens = num_tokens or sum(q_lens)
    num_seqs = num_seqs or len(chunks)
    max_blocks = max_blocks or max(len(c.block_table) for c in chunks)
    max_query_len = max_query_len or max(q_lens)
    if sum(q_lens) > num_tokens or len(chunks) > num_seqs or max(q_lens) > max_query_len:
        raise ValueError(f"chunks need {sum(q_lens)} tokens, {len(chunks)} sequences, query length "
                         f"{max(q_lens)}; padded sizes are {num_tokens}, {num_seqs}, {max_query_len}")

    token_ids = np.zeros(num_tokens, np.int32)
    positions = np.zeros(num_tokens, np.int32)
    slot_mapping = np.full(num_tokens, NULL_BLOCK * block_size, np.int32)
    block_tables = np.full((num_seqs, max_blocks), NULL_BLOCK, np.int32)
    context_lens = np.zeros(num_seqs, np.int32)
    query_start_loc = np.zeros(num_seqs + 1, np.int32)
    logits_indices: list[int] = []

    start = 0
    for s, chunk in enumerate(chunks):
        n, end_len = q_lens[s], chunk.num_cached + q_lens[s]
        table = np.asarray(chunk.block_table, np.int32)
        if len(table) * block_size < end_len or len(table) > max_blocks:
            raise ValueError(f"sequence {s}: block table of {len(table)} blocks cannot hold {end_len} tokens "
                             f"(block_size {block_size}, max_blocks {max_blocks})")
        pos = np.arange(chunk.num_cached, end_len, dtype=np.int32)
        token_ids[start:start + n] = chunk.token_ids
        positions[start:start + n] = pos
        slot_mapping[start:start + n] = table[pos // block_size] * block_size + pos % block_size
        block_tables[s, :len(table)] = table
        context_lens[s] = end_len
        logits_indices += {"last": [start + n - 1], "all": list(range(start, start + n)), "none": []}[chunk.want_logits]
        start += n
        query_start_loc[s + 1] = start
    query_start_loc[len(chunks) + 1:] = start

    num_logits = num_logits or max(len(logits_indices), 1)
    if len(logits_indices) > num_logits:
        raise ValueError(f"{len(logits_indices)} logits requested, padded size is {num_logits}")
    logits = np.zeros(num_logits, np.int32)
    logits[:len(logits_indices)] = logits_indices
    return StepBatch(token_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc,
                     logits, max_query_len=max_query_len)
