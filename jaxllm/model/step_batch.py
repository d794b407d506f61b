"""StepBatch: the flat arrays of one ragged forward step (prefill chunks and decode tokens mixed, in any order).

Built on the host with numpy and padded to bucket sizes, so the jitted forward only sees a few shapes.

    token_ids       [T]       tokens of all sequences back to back; padding after query_start_loc[S]
    positions       [T]       position of each token in its sequence
    slot_mapping    [T]       pool slot (block * B + offset) where each token's K/V is written; padding -> null block
    block_tables    [S, MB]   each sequence's block ids in order; padding -> null block
    context_lens    [S]       tokens of each sequence in the pool after this step (cached + new); 0 for padding
    query_start_loc [S+1]     sequence s owns tokens query_start_loc[s]:query_start_loc[s+1]
    logits_indices  [R]       which tokens' final hidden states (and logits) the step returns
    lora_slots      [T]       each token's LoRA adapter slot (0: the base model); None when LoRA is off
    decode_only     static    every sequence has at most one new token (lets the Pallas path pick its split-KV
                              kernel); the reference attention ignores it

    rows:    | seq 0 | seq 1 | ... | padding rows |        tokens: | seq 0's | seq 1's | ... | padding |
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

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
    lora_slots: Optional[jax.Array] = None
    decode_only: bool = struct.field(pytree_node=False, default=False)


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
    num_logits: int | None = None,
) -> StepBatch:
    """Pack chunks, in order, into numpy arrays padded to the given sizes (defaults: exactly what they need). The
    layout is the engine's own (lay_out_tokens); the engine's InputBatch fills the token ids from its request
    copies instead."""
    q_lens = np.asarray([len(c.token_ids) for c in chunks], np.int32)
    total = int(q_lens.sum())
    num_tokens = num_tokens or total
    num_seqs = num_seqs or len(chunks)
    max_blocks = max_blocks or max(len(c.block_table) for c in chunks)
    if total > num_tokens or len(chunks) > num_seqs:
        raise ValueError(f"chunks need {total} tokens and {len(chunks)} sequences; padded sizes are "
                         f"{num_tokens} tokens and {num_seqs} sequences")
    block_tables = np.full((num_seqs, max_blocks), NULL_BLOCK, np.int32)
    for row, chunk in enumerate(chunks):
        end_len = chunk.num_cached + q_lens[row]
        if len(chunk.block_table) * block_size < end_len or len(chunk.block_table) > max_blocks:
            raise ValueError(f"sequence {row}: block table of {len(chunk.block_table)} blocks cannot hold "
                             f"{end_len} tokens (block_size {block_size}, max_blocks {max_blocks})")
        block_tables[row, :len(chunk.block_table)] = chunk.block_table
    starts = np.asarray([c.num_cached for c in chunks], np.int32)
    positions, slot_mapping, context_lens, query_start_loc = lay_out_tokens(q_lens, starts, block_tables,
                                                                            num_tokens, block_size)
    token_ids = np.zeros(num_tokens, np.int32)
    token_ids[:total] = np.concatenate([np.asarray(c.token_ids, np.int32) for c in chunks]) if chunks else []
    logits_indices = [int(query_start_loc[row]) + offset for row, chunk in enumerate(chunks)
                      for offset in _logit_offsets(chunk.want_logits, int(q_lens[row]))]
    num_logits = num_logits or max(len(logits_indices), 1)
    if len(logits_indices) > num_logits:
        raise ValueError(f"{len(logits_indices)} logits requested, padded size is {num_logits}")
    logits = np.zeros(num_logits, np.int32)
    logits[:len(logits_indices)] = logits_indices
    return StepBatch(token_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc, logits,
                     decode_only=bool(q_lens.max() <= 1))


def lay_out_tokens(q_lens: np.ndarray, starts: np.ndarray, block_tables: np.ndarray, num_tokens: int,
                   block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where each of a step's tokens goes, vectorized over the step: chunk i computes q_lens[i] tokens from
    position starts[i] with the block table block_tables[i] ([S, MB], padded with the null block).

    -> positions [T], slot_mapping [T] (padding -> the null block), context_lens [S], query_start_loc [S+1]."""
    num_chunks, total = len(q_lens), int(q_lens.sum())
    num_rows = block_tables.shape[0]
    query_start_loc = np.full(num_rows + 1, total, np.int32)
    query_start_loc[0] = 0
    query_start_loc[1:num_chunks + 1] = np.cumsum(q_lens)
    row_of = np.repeat(np.arange(num_chunks), q_lens)  # [total] the chunk of each token
    positions = np.zeros(num_tokens, np.int32)
    positions[:total] = np.arange(total) - query_start_loc[row_of] + starts[row_of]
    slot_mapping = np.full(num_tokens, NULL_BLOCK * block_size, np.int32)
    pos = positions[:total]
    slot_mapping[:total] = block_tables[row_of, pos // block_size] * block_size + pos % block_size
    context_lens = np.zeros(num_rows, np.int32)
    context_lens[:num_chunks] = starts + q_lens
    return positions, slot_mapping, context_lens, query_start_loc


def _logit_offsets(want: str | Sequence[int], num_new: int) -> Sequence[int]:
    if isinstance(want, str):
        return {"last": [num_new - 1], "all": range(num_new), "none": []}[want]
    if any(not 0 <= offset < num_new for offset in want):
        raise ValueError(f"logit offsets {list(want)} fall outside a chunk of {num_new} tokens")
    return want
