"""The sampler rows of a step with proposals: a sequence with k proposals is sampled at its last k + 1 query
positions (after its newest token and after each proposal), back to back in chunk order.

    chunk   q_len  proposals  sampler rows (logits_indices)
    a       1      0          qs[a]
    b       5      4          qs[b] .. qs[b] + 4
    c       30     0          qs[c] + 29          (a prefill chunk that reaches its prompt's end)

SpecRows carries, per sampled chunk, its first sampler row and its proposals; the rows' noise counters move on
by their index in the run (row i samples the request's output num_output + i).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class SpecRows:
    first_rows: np.ndarray  # [N] each sampled chunk's first sampler row
    num_drafts: np.ndarray  # [N] its proposals (0: a plain sample)
    proposals: list[np.ndarray]  # N arrays [num_drafts[i]] int32

    @property
    def num_rows(self) -> int:
        return int(self.first_rows[-1] + self.num_drafts[-1] + 1) if len(self.first_rows) else 0


def first_sampler_rows(num_drafts: np.ndarray) -> tuple[np.ndarray, int]:
    """([N] each sampled chunk's first sampler row, the step's sampler rows R) for num_drafts [N], the proposals
    of each sampled chunk in chunk order: a chunk with k proposals owns k + 1 rows, back to back."""
    per_chunk = 1 + np.asarray(num_drafts, np.int64)  # [N]
    return np.cumsum(per_chunk) - per_chunk, int(per_chunk.sum())


def spec_rows(sampled_chunks: np.ndarray, num_drafts: np.ndarray, query_start_loc: np.ndarray,
              q_lens: np.ndarray, proposals: list[list[int]]) -> tuple[SpecRows, np.ndarray, np.ndarray,
                                                                     np.ndarray]:
    """(SpecRows, logits rows [R], each row's chunk [R], each row's index in its run [R]) for the sampled chunks
    [N] (chunk indices, in order); num_drafts [C] per chunk, proposals per sampled chunk."""
    per_chunk = 1 + num_drafts[sampled_chunks]  # [N] rows
    first, _ = first_sampler_rows(num_drafts[sampled_chunks])  # [N]
    chunk_of_row = np.repeat(sampled_chunks, per_chunk)  # [R]
    offsets = np.arange(int(per_chunk.sum())) - np.repeat(first, per_chunk)  # [R] index in the run
    last = query_start_loc[chunk_of_row] + q_lens[chunk_of_row] - 1  # [R] the chunk's last position
    logits_rows = last - np.repeat(per_chunk - 1, per_chunk) + offsets  # [R]
    rows = SpecRows(first.astype(np.int32), num_drafts[sampled_chunks].astype(np.int32),
                    [np.asarray(p, np.int32) for p in proposals])
    return rows, logits_rows, chunk_of_row, offsets
