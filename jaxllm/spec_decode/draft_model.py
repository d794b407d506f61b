"""Draft-model proposals (vLLM's draft_model method): a smaller model with the target's vocabulary proposes k
tokens per sequence, greedily (the argmax of its logits), for the target to verify (spec_decode/rejection.py).

    proposal round, for the sequences that speculate this step:
        catch-up step(s): each sequence's tokens the draft has not seen (prompt chunks, accepted tokens) -> d1
        k - 1 single-token decode steps:  d1 -> d2,  d2 -> d3, ...
    the draft's KV then holds the sequence's tokens and d1 .. d(k-1); at the next round the draft's computed count
    rolls back to the longest prefix those share with the sequence's tokens (the accepted proposals), and the
    positions past it are overwritten.

The proposals are a deterministic function of the context (greedy), i.e. a point mass, like n-gram proposals,
so rejection.py's rule (draw y from the target's row, accept while y equals the proposal) keeps every emitted
token distributed exactly as the target's: P(y = d) = p(d), and y given y != d follows p without d,
renormalized. Greedy target sampling accepts while the argmax equals the proposal.

The draft runs on its own ModelRunner (the target's token buckets, its own compiled programs and KV pool) with
its own block pool, without prefix caching. Each round the runner is handed each sequence anew (its known
tokens, its draft block table) and forgets it at the end, so the runner's copy never holds rejected tokens. The
pool has as many blocks as the target's (the same token capacity; its bytes scale with the draft's layers and
KV heads), and both come out of one memory budget (EngineArgs.resolve): the draft's weights are counted with the
target's, and the KV budget is split so that each pool holds budget // (target block bytes + draft block bytes)
blocks; an explicit num_gpu_blocks sizes both. A sequence whose blocks the draft pool cannot supply gets no
proposals that step.
"""

from __future__ import annotations

import dataclasses

from jaxllm.config import CacheConfig, SchedulerConfig
from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.scheduler import NO_POSITIONS, NewRequestData, ScheduledChunk, SchedulerOutput
from jaxllm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@dataclasses.dataclass(eq=False)
class DraftState:
    """One sequence in the draft: the tokens whose K/V the draft's pool holds, in order (the last proposal
    round's input: the sequence's tokens then its proposals but the last)."""

    request_id: str
    fed: list[int] = dataclasses.field(default_factory=list)
    num_own: int = 0  # the first num_own of `fed` were the sequence's own tokens (they stay a prefix of them)
    num_computed_tokens: int = 0  # those of `fed` still valid (KVCacheManager reads this name)


def check_draft_parallel(draft_name: str, num_processes: int) -> None:
    """ValueError for a target run by several processes (checked before the draft is loaded): the draft runs on
    one device, the first of the target's mesh, which one process alone can reach."""
    if num_processes != 1:
        raise ValueError(f"speculative_config: a draft model with a target run by {num_processes} processes is not "
                         f"supported (the draft model {draft_name!r} runs on one device of one process)")


def check_draft(draft_name: str, draft_config, target_name: str, target_config, max_model_len: int) -> None:
    """ValueError for a draft that cannot propose for this target."""
    if draft_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"speculative_config: the draft model {draft_name!r} has vocab_size "
                         f"{draft_config.vocab_size}, the target model {target_name!r} has "
                         f"{target_config.vocab_size}: a draft must share the target's vocabulary")
    if draft_config.max_position_embeddings < max_model_len:
        raise ValueError(f"speculative_config: the draft model {draft_name!r} has a context of "
                         f"{draft_config.max_position_embeddings} tokens (max_position_embeddings), shorter than "
                         f"the target model {target_name!r}'s max_model_len {max_model_len}")


class DraftProposer:
    def __init__(self, runner, block_size: int, num_blocks: int):
        """runner: the draft's ModelRunner (its KV pool of num_blocks blocks of block_size tokens)."""
        self.runner = runner
        self.kv_cache = KVCacheManager(BlockPool(num_blocks, enable_prefix_caching=False), block_size)
        self.states: dict[str, DraftState] = {}
        self._step_id = 0

    @classmethod
    def build(cls, loaded, scheduler: SchedulerConfig, cache: CacheConfig, **runner_kwargs) -> "DraftProposer":
        """The draft's runner over the target's buckets, with a pool of as many blocks as the target's (the
        memory budget was split for both: EngineArgs.resolve)."""
        from jaxllm.engine.runner import ModelRunner  # the runner imports the scheduler, which imports this

        draft_cache = CacheConfig(block_size=cache.block_size, num_blocks=cache.num_blocks,
                                  enable_prefix_caching=False)
        return cls(ModelRunner(loaded, draft_cache, scheduler, **runner_kwargs), cache.block_size, cache.num_blocks)

    def free(self, request_id: str) -> None:
        """Drop a sequence's draft state and blocks (it finished, was aborted or preempted)."""
        state = self.states.pop(request_id, None)
        if state is not None:
            self.kv_cache.forget(state)

    def propose(self, wanted: list[tuple[str, list[int], int]]) -> dict[str, list[int]]:
        """(request id, its tokens, k) -> its k greedy proposals; none for a sequence the pool cannot hold."""
        sequences = [(state, tokens, k) for rid, tokens, k in wanted
                     if (state := self._roll_back(rid, tokens, k)) is not None]
        if not sequences:
            return {}
        proposals = self._catch_up(sequences)
        for j in range(1, max(k for _, _, k in sequences)):
            decoding = [(state, tokens) for state, tokens, k in sequences if k > j]
            tokens_out = self._run([self._chunk(state, len(tokens) + j - 1, 1, True) for state, tokens in decoding])
            for state, _ in decoding:
                proposals[state.request_id].append(tokens_out[state.request_id])
        for state, tokens, k in sequences:
            state.fed = tokens + proposals[state.request_id][:k - 1]
            state.num_own = len(tokens)
            state.num_computed_tokens = len(state.fed)
        self.runner.forget([state.request_id for state, _, _ in sequences])
        return proposals

    def _roll_back(self, request_id: str, tokens: list[int], k: int) -> DraftState | None:
        """Its state, its computed count rolled back to what its tokens share with the draft's, and blocks for
        the round's tokens; None (and its draft state dropped) when the pool cannot supply them."""
        state = self.states.setdefault(request_id, DraftState(request_id))
        valid = min(_common_prefix(state.fed, tokens, state.num_own), len(tokens) - 1)  # >= 1 token to run
        state.num_computed_tokens = valid
        if not self.kv_cache.allocate(state, len(tokens) - valid + k - 1):
            self.free(request_id)
            return None
        return state

    def _catch_up(self, sequences) -> dict[str, list[int]]:
        """Run each sequence's unseen tokens (chunked to the token budget); its first proposal from the last."""
        budget = self.runner.buckets.max_num_batched_tokens
        todo = {state.request_id: state.num_computed_tokens for state, _, _ in sequences}  # next position
        proposals: dict[str, list[int]] = {}
        held: set[str] = set()
        while len(proposals) < len(sequences):
            chunks, left = [], budget
            for state, tokens, _ in sequences:
                start = todo[state.request_id]
                if start >= len(tokens) or left == 0:
                    continue
                num_new = min(len(tokens) - start, left)
                chunks.append(self._chunk(state, start, num_new, start + num_new == len(tokens),
                                          None if state.request_id in held else tokens))
                held.add(state.request_id)
                todo[state.request_id] += num_new
                left -= num_new
            for request_id, token in self._run(chunks).items():
                proposals[request_id] = [token]
        return proposals

    def _chunk(self, state: DraftState, start: int, num_new: int, samples: bool,
               tokens: list[int] | None = None) -> ScheduledChunk:
        """A chunk of the round; `tokens`: the sequence's tokens, when the runner is handed it (its first)."""
        new = None if tokens is None else NewRequestData(state.request_id, list(tokens), [], GREEDY, 0, False, 0)
        blocks = self.kv_cache.block_ids(state) if tokens is not None else []
        return ScheduledChunk(state.request_id, num_new, start, blocks, samples, NO_POSITIONS, new)

    def _run(self, chunks: list[ScheduledChunk]) -> dict[str, int]:
        """One draft step; the token sampled for each sampling chunk."""
        self._step_id += 1
        results = self.runner.fetch(self.runner.dispatch(SchedulerOutput(self._step_id, chunks, [])))
        return results.tokens

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache.pool.num_free_blocks


def _common_prefix(a: list[int], b: list[int], start: int) -> int:
    """How many leading tokens a and b share, given they share the first `start`."""
    n = min(len(a), len(b))
    for i in range(start, n):
        if a[i] != b[i]:
            return i
    return n
