"""SpecDecodingStats: vLLM's speculative-decoding counters, totals since the engine started.

    num_drafts                  sequences verified with at least one proposal, counted per step
    num_draft_tokens            proposals verified
    num_accepted_tokens         proposals accepted
    num_accepted_tokens_per_pos [k] proposals accepted at position i (0-based) of their run

They are /metrics' vllm:spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens and
_num_accepted_tokens_per_pos{position="i"}, and LLMEngine.stats()'s spec_decode_* entries.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class SpecDecodingStats:
    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One sequence's verification: num_draft_tokens proposals, the first num_accepted of them accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.num_accepted_tokens_per_pos[position] += 1

    def as_stats(self) -> dict:
        return {"spec_decode_num_drafts": self.num_drafts, "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos)}
