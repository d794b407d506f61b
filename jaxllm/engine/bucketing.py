"""Shape buckets: every step is padded to sizes from small fixed sets, so XLA compiles a bounded, known set of
programs however requests arrive.

    T  tokens per step          powers of two S .. max(max_num_batched_tokens, 2 * max_num_seqs), rounded up
    S  sequences per step       powers of two 1 .. max_num_seqs (decode-only steps); up to 2 * max_num_seqs
                                in mixed steps, whose decode rows and pow2-padded prefill rows add up
    MB blocks per sequence      powers of two 1 .. ceil(max_model_len / block_size)
    P  prefill rows (> 1 token) 0, or powers of two 1 .. S
    Q  prefill query length     1 when P = 0, else powers of two 2 .. T

A decode-only step is (T = S, S, MB, P = 0, Q = 1); the logits rows are padded to S (one per sequence).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Sequence


def pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def pow2_range(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from pow2_at_least(lo) through pow2_at_least(hi)."""
    out, value = [], pow2_at_least(lo)
    while value <= pow2_at_least(hi):
        out.append(value)
        value *= 2
    return tuple(out)


@dataclasses.dataclass(frozen=True, order=True)
class StepShape:
    num_tokens: int  # T
    num_seqs: int  # S
    max_blocks: int  # MB
    num_prefill_rows: int  # P
    max_query_len: int  # Q


@dataclasses.dataclass(frozen=True)
class Buckets:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_blocks_per_seq: int

    def shape_for(self, query_lens: Sequence[int], blocks_per_seq: Sequence[int]) -> StepShape:
        """The bucketed shape of a step whose sequences have these new-token counts and block-table lengths."""
        num_prefill = sum(1 for n in query_lens if n > 1)
        prefill_rows = pow2_at_least(num_prefill) if num_prefill else 0
        num_seqs = pow2_at_least(len(query_lens) - num_prefill + prefill_rows)
        num_tokens = max(pow2_at_least(sum(query_lens)), num_seqs)
        max_query_len = pow2_at_least(max(query_lens)) if num_prefill else 1
        return StepShape(num_tokens, num_seqs, pow2_at_least(max(blocks_per_seq)), prefill_rows, max_query_len)

    def all_shapes(self) -> Iterator[StepShape]:
        """Every shape shape_for can return for requests within the limits: the bucket set."""
        yield from self.decode_shapes()
        for s, mb in itertools.product(self._mixed_seq_sizes(), self._block_sizes()):
            for p, t in itertools.product(pow2_range(1, s), self._token_sizes()):
                if t >= s:
                    yield from (StepShape(t, s, mb, p, q) for q in pow2_range(2, t))

    def decode_shapes(self) -> list[StepShape]:
        return [StepShape(s, s, mb, 0, 1) for s, mb in itertools.product(self._seq_sizes(), self._block_sizes())]

    def _seq_sizes(self) -> tuple[int, ...]:
        return pow2_range(1, self.max_num_seqs)

    def _mixed_seq_sizes(self) -> tuple[int, ...]:
        """Decode rows + prefill rows rounded up to a power of two can reach 2 * max_num_seqs - 1."""
        return pow2_range(1, 2 * self.max_num_seqs - 1)

    def _block_sizes(self) -> tuple[int, ...]:
        return pow2_range(1, self.max_blocks_per_seq)

    def _token_sizes(self) -> tuple[int, ...]:
        return pow2_range(1, max(self.max_num_batched_tokens, 2 * self.max_num_seqs - 1))
