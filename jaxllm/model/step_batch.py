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
    num_prefill_rows static   P: rows [0, S-P) hold at most one new token (decodes), rows [S-P, S) the longer
                              chunks; attention pads only those P rows to max_query_len

Row layout chosen by build_step_batch (tokens follow the row order):

    rows:  | decode 0 | decode 1 | ... | padding ... | prefill 0 | prefill 1 | padding |
           |<------------ S - P ------------------->|<------------- P ------------->|
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
    num_prefill_rows: int | None = struct.field(pytree_node=False, default=None)  # None: all rows are padded


@dataclasses.dataclass
class SequenceChunk:
    """Host description of one sequence's share of a step."""

    token_ids: Sequence[int]  # the new tokens this step computes
    num_cached: int  # tokens already in the pool before this step
    block_table: Sequence[int]  # block ids covering at least num_cached + len(token_ids) tokens
    want_logits: str | Sequence[int] = "last"  # "last" | "all" | "none" | offsets into token_ids


def build_step_batch(
    chunks: Sequence[SequenceChunk],
    block_size: int,
    *,
    num_tokens: int | None = None,
    num_seqs: int | None = None,
    max_blocks: int | None = None,
    max_query_len: int | None = None,
    num_logits: int | None = None,
    num_prefill_rows: int | None = None,
) -> StepBatch:
    """Pack chunks into numpy arrays padded to the given sizes (defaults: exactly what the chunks need).

    Chunks with one new token go to the first rows, longer ones to the last num_prefill_rows rows; logits rows
    come back in the order of `chunks` regardless.
    """
    q_lens = [len(c.token_ids) for c in chunks]
    is_prefill = [n > 1 for n in q_lens]
    num_tokens = num_tokens or sum(q_lens)
    num_seqs = num_seqs or len(chunks)
    max_blocks = max_blocks or max(len(c.block_table) for c in chunks)
    max_query_len = max_query_len or max(q_lens)
    prefill_rows = sum(is_prefill) if num_prefill_rows is None else num_prefill_rows
    if (sum(q_lens) > num_tokens or max(q_lens) > max_query_len or sum(is_prefill) > prefill_rows
            or len(chunks) - sum(is_prefill) > num_seqs - prefill_rows):
        raise ValueError(f"chunks need {sum(q_lens)} tokens, {len(chunks)} sequences ({sum(is_prefill)} longer than "
                         f"one token), query length {max(q_lens)}; padded sizes are {num_tokens} tokens, {num_seqs} "
                         f"sequences ({prefill_rows} prefill rows), query length {max_query_len}")
    row_of = _assign_rows(is_prefill, num_seqs - prefill_rows)

    token_ids = np.zeros(num_tokens, np.int32)
    positions = np.zeros(num_tokens, np.int32)
    slot_mapping = np.full(num_tokens, NULL_BLOCK * block_size, np.int32)
    block_tables = np.full((num_seqs, max_blocks), NULL_BLOCK, np.int32)
    context_lens = np.zeros(num_seqs, np.int32)
    row_lens = np.zeros(num_seqs, np.int32)
    for i, chunk in enumerate(chunks):
        row_lens[row_of[i]] = q_lens[i]
    query_start_loc = np.concatenate([[0], np.cumsum(row_lens)]).astype(np.int32)

    logits_indices: list[int] = []
    for i, chunk in enumerate(chunks):
        row, n = row_of[i], q_lens[i]
        start, end_len = query_start_loc[row], chunk.num_cached + n
        table = np.asarray(chunk.block_table, np.int32)
        if len(table) * block_size < end_len or len(table) > max_blocks:
            raise ValueError(f"sequence {i}: block table of {len(table)} blocks cannot hold {end_len} tokens "
                             f"(block_size {block_size}, max_blocks {max_blocks})")
        pos = np.arange(chunk.num_cached, end_len, dtype=np.int32)
        token_ids[start:start + n] = chunk.token_ids
        positions[start:start + n] = pos
        slot_mapping[start:start + n] = table[pos // block_size] * block_size + pos % block_size
        block_tables[row, :len(table)] = table
        context_lens[row] = end_len
        logits_indices += [start + offset for offset in _logit_offsets(chunk.want_logits, n)]

    num_logits = num_logits or max(len(logits_indices), 1)
    if len(logits_indices) > num_logits:
        raise ValueError(f"{len(logits_indices)} logits requested, padded size is {num_logits}")
    logits = np.zeros(num_logits, np.int32)
    logits[:len(logits_indices)] = logits_indices
    return StepBatch(token_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc, logits,
                     max_query_len=max_query_len, num_prefill_rows=prefill_rows)


def _assign_rows(is_prefill: Sequence[bool], first_prefill_row: int) -> list[int]:
    """Row of each chunk: one-token chunks fill rows 0, 1, ...; longer ones rows first_prefill_row, ..."""
    rows, next_decode, next_prefill = [], 0, first_prefill_row
    for prefill in is_prefill:
        if prefill:
            rows.append(next_prefill)
            next_prefill += 1
        else:
            rows.append(next_decode)
            next_decode += 1
    return rows


def _logit_offsets(want: str | Sequence[int], num_new: int) -> Sequence[int]:
    if isinstance(want, str):
        return {"last": [num_new - 1], "all": range(num_new), "none": []}[want]
    if any(not 0 <= offset < num_new for offset in want):
        raise ValueError(f"logit offsets {list(want)} fall outside a chunk of {num_new} tokens")
    return want
