"""Shape buckets: the step's programs are compiled per bucket, so XLA builds a small set, known in advance,
however requests arrive; warm-up compiles all of it.

    T  tokens per step        powers of two 1 .. max_num_batched_tokens (rounded up): the forward's key
    S  sampled sequences      powers of two 2 .. max_num_seqs (rounded up): the sampler's key; one sampled row
                              runs in the S = 2 program (a pad row costs less than one more program to warm)

Everything else has one size per engine: a forward of T tokens has min(T, max_num_seqs) sequence rows, block
tables of max_blocks_per_seq columns, and returns the hidden states of `num_logits_rows` rows:

    logits rows:  | sampled rows: S_max = pow2(max_num_seqs) | prompt-logprob rows: max_num_batched_tokens, rounded |
                    the sampler reads the first S                the prompt-logprob program reads PROMPT_ROWS at a time

The programs of an engine (ProgramKey):

    forward          one per T; on the Pallas path also one per decode-only T <= S_max (the split-KV kernel)
    sample           one per S (what a batch asks for, greedy or not, filters, penalties, logprobs, is read at
                     run time)
    prompt_logprobs  one (PROMPT_ROWS rows per call)
    write_logit_rows one (a request's logit-adjustment rows into its slot: engine/step_programs.py)
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from pallas_kernels.sizes import pow2_at_least

PROMPT_ROWS = 64  # prompt-logprob rows per call of the prompt-logprob program


def pow2_range(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from pow2_at_least(lo) through pow2_at_least(hi)."""
    out, value = [], pow2_at_least(lo)
    while value <= pow2_at_least(hi):
        out.append(value)
        value *= 2
    return tuple(out)


@dataclasses.dataclass(frozen=True, order=True)
class ProgramKey:
    kind: str  # "forward" | "sample" | "prompt_logprobs" | "write_logit_rows"
    size: int = 0  # T for forward, S for sample
    decode_only: bool = False  # forward only: every sequence has one new token (the Pallas split-KV kernel)

    def __str__(self) -> str:
        if self.kind == "forward":
            return f"forward T={self.size}" + (" decode-only" if self.decode_only else "")
        if self.kind == "sample":
            return f"sample S={self.size}"
        return self.kind


@dataclasses.dataclass(frozen=True)
class Buckets:
    max_num_batched_tokens: int
    max_num_seqs: int
    decode_only_programs: bool = False  # the Pallas path compiles decode-only forwards apart

    @property
    def token_sizes(self) -> tuple[int, ...]:
        return pow2_range(1, self.max_num_batched_tokens)

    @property
    def sample_sizes(self) -> tuple[int, ...]:
        return pow2_range(min(2, self.max_num_seqs), self.max_num_seqs)

    @property
    def num_sample_rows(self) -> int:
        return self.sample_sizes[-1]

    @property
    def num_logits_rows(self) -> int:
        """Rows of the forward's hidden-state output: sampled rows, then prompt-logprob rows."""
        return self.num_sample_rows + -(-self.max_num_batched_tokens // PROMPT_ROWS) * PROMPT_ROWS

    def num_seq_rows(self, num_tokens_bucket: int) -> int:
        """Sequence rows of a forward of T tokens: a step has at most one sequence per token."""
        return min(num_tokens_bucket, self.max_num_seqs)

    def forward_key(self, num_tokens: int, decode_only: bool) -> ProgramKey:
        if num_tokens > self.max_num_batched_tokens:
            raise ValueError(f"a step of {num_tokens} tokens exceeds max_num_batched_tokens "
                             f"{self.max_num_batched_tokens}")
        return ProgramKey("forward", pow2_at_least(num_tokens), decode_only and self.decode_only_programs)

    def sample_key(self, num_rows: int) -> ProgramKey:
        if num_rows > self.max_num_seqs:
            raise ValueError(f"{num_rows} sampled sequences exceed max_num_seqs {self.max_num_seqs}")
        return ProgramKey("sample", max(pow2_at_least(num_rows), self.sample_sizes[0]))

    def all_programs(self) -> Iterator[ProgramKey]:
        """Every program a step can need: the set warm-up compiles."""
        for t in self.token_sizes:
            if t > 1 or not self.decode_only_programs:  # one token is always a decode
                yield ProgramKey("forward", t, False)
            if self.decode_only_programs and t <= pow2_at_least(self.max_num_seqs):
                yield ProgramKey("forward", t, True)
        for s in self.sample_sizes:
            yield ProgramKey("sample", s)
        yield ProgramKey("prompt_logprobs")
        yield ProgramKey("write_logit_rows")
