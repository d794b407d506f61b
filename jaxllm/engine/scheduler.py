"""The scheduler counts tokens, not phases: every step moves each chosen request's num_computed_tokens toward
its num_tokens within a token budget (max_num_batched_tokens) and a sequence budget (max_num_seqs).

    step:  running requests first (decodes and unfinished prefill chunks), in order
           -> then waiting requests (FCFS, or by priority), prefix-cache hits first, long prompts chunked; a
              request whose grammar (structured outputs) is still compiling waits, and those behind it go first
           -> when the pool runs dry, the lowest-ranked running request is preempted: its blocks are freed and it
              goes back to the front of the waiting queue, to be recomputed (its output so far is kept)

Host-only: the output is plain data (SchedulerOutput: request ids, token counts, block ids, and a request's
prompt, outputs and sampling parameters the first time the runner sees it), which the runner turns into device
arrays from its own copy of each request; it never sees a Request. The scheduler keeps the Requests of each
output it made (scheduled_requests) until update() takes that output's results.

Scheduling commits a step: each chunk's tokens count as computed at once, and a chunk that samples leaves its
request one pending token (sampled on the device, value not yet known here). So the next step can be scheduled
before this one's tokens come back (async scheduling): a request whose newest token is pending computes it next
(the runner feeds it from the device), and update() later appends its value and applies the stop rules. A step
scheduled ahead may give a request one token too many (it hit EOS meanwhile): that token is dropped, never
reported. Requests at their length limit with a token pending are not scheduled ahead; a preempted request
keeps its pending token (update appends it while it waits) and is not admitted again before it arrives.

Speculative decoding (speculative_config): a decoding request whose tokens are all known (none pending) gets
proposals d1 .. dk (n-gram ones, or a draft model's, made for all such requests in one batch first); its chunk is
1 + k tokens (its newest token and the proposals: SchedulerOutput.scheduled_spec_decode_tokens), all counted as
computed and allocated for, and it is not scheduled again until update() has verified them. Then the rejected
proposals are rolled back: num_computed_tokens loses them, the accepted run is appended token by token under the
stop rules (EOS, stop ids, max_tokens end it inside the run), and only then are full blocks registered in the
prefix cache, so no rejected token is ever hashed. The blocks allocated for rejected positions stay the request's
(its next steps fill them; its end frees them); the K/V written there is overwritten when those positions are
computed again. Proposals take sampler rows: at most max_num_seqs rows per step, so k is capped by the rows no
running or waiting request can need.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from jaxllm.config import SchedulerConfig
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.request import Request, RequestStatus
from jaxllm.lora.manager import LoRAManager
from jaxllm.sampling_params import SamplingParams
from jaxllm.spec_decode.config import SpeculativeConfig
from jaxllm.spec_decode.eligibility import AcceptanceTracker, can_speculate
from jaxllm.spec_decode.metrics import SpecDecodingStats
from jaxllm.spec_decode.ngram import propose_ngram

if TYPE_CHECKING:
    from jaxllm.spec_decode.draft_model import DraftProposer

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NewRequestData:
    """A request the runner does not hold yet (first scheduled, or again after preemption), as plain data."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # outputs known so far (a request recomputed after preemption has some)
    sampling_params: SamplingParams
    rng_stream: int
    needs_sample_logprobs: bool
    lora_int_id: int


@dataclasses.dataclass(slots=True)
class ScheduledChunk:
    """One request's share of a step, as plain data (the runner keeps its own copy of each request); not changed
    once made (not frozen only because a frozen dataclass is four times slower to make, 256 times a step)."""

    request_id: str
    num_new_tokens: int
    num_computed_before: int  # tokens already in the pool: the chunk starts at this position
    new_block_ids: list[int]  # blocks allocated since the runner last heard of the request (all, when `new`)
    samples: bool  # the chunk reaches the request's newest token, so a new token is sampled after it
    prompt_logprob_positions: range  # prompt positions p whose logits (scoring token p + 1) this chunk reports
    new: NewRequestData | None = None  # set when the runner does not hold the request


NO_POSITIONS = range(0)
@dataclasses.dataclass
class SchedulerOutput:
    """What the runner gets: plain data only (ids, counts, token ids, block ids, sampling parameters)."""

    step_id: int
    chunks: list[ScheduledChunk]  # running requests first, then newly admitted ones
    preempted_request_ids: list[str]
    finished_request_ids: list[str] = dataclasses.field(default_factory=list)  # ended since the last schedule
    lora_loads: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (slot, lora id) to write first
    lora_slot_of: dict[int, int] = dataclasses.field(default_factory=lambda: {0: 0})  # lora id -> its slot
    # request id -> its proposals, verified by this step (its chunk: its newest token, then these)
    scheduled_spec_decode_tokens: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, lora: LoRAManager | None = None,
                 speculative: SpeculativeConfig | None = None, proposer: DraftProposer | None = None):
        """lora: the adapters' manager when LoRA is on: a waiting request is admitted only once its adapter has a
        device slot (LoRAManager.acquire); otherwise it waits, and requests behind it may go first.
        speculative: speculative decoding's settings (None: off); proposer: the draft model's (method
        "draft_model"), else proposals are n-gram ones."""
        self.speculative = speculative
        self.proposer = proposer
        self.spec_stats = None if speculative is None else SpecDecodingStats(speculative.num_speculative_tokens)
        self.config = config
        self.kv_cache = kv_cache
        self.lora = lora
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []  # ended since the last schedule (the runner drops their state)
        self._num_steps = 0
        self._scheduled: dict[int, list[Request]] = {}  # step_id -> the Requests of its chunks, until update()
        self.num_preemptions = 0  # totals, for the server's metrics
        self.num_prompt_tokens_computed = 0  # prompt positions scheduled for computation (cached ones are not)
        self.num_waiting_for_lora = 0  # waiting requests the last schedule passed over for want of an adapter slot
        self.failed: list[Request] = []  # ended because their grammar could not be compiled (the engine reports)

    # ------------------------------------------------------------------ requests in and out
    def add_request(self, request: Request) -> None:
        """Queue a request; raises ValueError if it could never run (its full length exceeds the context or the
        pool), so nothing is left waiting forever."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        total = request.length_limit = request.max_total_tokens(self.config.max_model_len)
        if request.num_prompt_tokens >= self.config.max_model_len:
            raise ValueError(f"prompt has {request.num_prompt_tokens} tokens; max_model_len is "
                             f"{self.config.max_model_len} and at least one token must be generated")
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None and request.num_prompt_tokens + max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt ({request.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = "
                             f"{request.num_prompt_tokens + max_tokens} exceeds max_model_len "
                             f"{self.config.max_model_len}")
        needed = self.kv_cache.blocks_needed(total)
        if needed > self.kv_cache.pool.num_usable_blocks:
            raise ValueError(f"request needs {needed} KV blocks for {total} tokens, but the pool only has "
                             f"{self.kv_cache.pool.num_usable_blocks}; increase num_blocks or lower max_tokens")
        if self.speculative is not None and can_speculate(request.sampling_params):
            request.spec = AcceptanceTracker()
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish(self, request: Request, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        """End a request (stopped, length, aborted): its blocks go back to the pool at once."""
        if request.status.finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        request.stop_reason = stop_reason
        self.kv_cache.forget(request)
        if self.proposer is not None:
            self.proposer.free(request.request_id)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is not None:
            self.finish(request, RequestStatus.FINISHED_ABORTED)
        return request

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks: list[tuple[Request, int]] = []  # (request, its new tokens)
        preempted: list[Request] = []
        drafts: dict[str, list[int]] = {}  # request id -> its proposals (speculative decoding)
        draft_rows = self._draft_row_budget()
        self._drafted = self._draft_model_proposals(draft_rows) if self.proposer is not None else {}

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if self._finishes_with_pending_token(request) or request.num_spec_in_flight:
                index += 1
                continue
            num_new = min(request.num_tokens + request.num_pending - request.num_computed_tokens, budget)
            if draft_rows and self._speculates_now(request, num_new):
                proposals = self._propose(request, min(budget - 1, draft_rows))
                if proposals and self.kv_cache.allocate(request, num_new + len(proposals)):
                    drafts[request.request_id] = proposals
                    draft_rows -= len(proposals)
                    num_new += len(proposals)
            while not self.kv_cache.allocate(request, num_new):
                victim = self._lowest_ranked_running()
                self._preempt(victim, chunks)
                preempted.append(victim)
                budget = self.config.max_num_batched_tokens - sum(n for _, n in chunks)
                if victim is request:
                    break  # preempted itself: `index` now points at the next request
                index = min(index, self.running.index(request))
            else:  # allocated
                chunks.append((request, num_new))
                budget -= num_new
                index += 1

        if not preempted:  # admitting while others are being evicted would only thrash
            budget = self._admit_waiting(chunks, budget)
        scheduled = [self._commit(request, num_new) for request, num_new in chunks]
        finished, self._finished_ids = self._finished_ids, []
        self._num_steps += 1
        out = SchedulerOutput(self._num_steps, scheduled, [r.request_id for r in preempted], finished)
        if drafts:
            out.scheduled_spec_decode_tokens = self._commit_drafts(drafts, chunks)
        if self.lora is not None:
            out.lora_loads, out.lora_slot_of = self.lora.take_loads(), {0: 0, **self.lora.slots}
        if chunks:
            self._scheduled[out.step_id] = [request for request, _ in chunks]
        return out

    def scheduled_requests(self, out: SchedulerOutput) -> list[Request]:
        """The Requests of out.chunks, in order (until update() takes out's results)."""
        return self._scheduled.get(out.step_id, [])

    def _commit(self, request: Request, num_new: int) -> ScheduledChunk:
        """The chunk as plain data; its tokens now count as computed, its sample as pending, its prompt-logprob
        positions as asked for."""
        start = request.num_computed_tokens
        samples = start + num_new >= request.num_tokens + request.num_pending
        blocks = self.kv_cache.blocks(request)
        new = None
        if request.num_blocks_sent is None:  # the runner does not hold it
            request.num_blocks_sent = 0
            new = NewRequestData(request.request_id, list(request.prompt_token_ids),
                                 list(request.output_token_ids), request.sampling_params, request.rng_stream,
                                 request.needs_sample_logprobs, request.lora_int_id)
        new_block_ids = []
        if len(blocks) > request.num_blocks_sent:
            new_block_ids = [b.block_id for b in blocks[request.num_blocks_sent:]]
            request.num_blocks_sent = len(blocks)
        positions = NO_POSITIONS
        if request.sampling_params.prompt_logprobs is not None and request.sample_index == 0:
            # each reported once, by the first sample (a request recomputed after preemption skips those an
            # earlier step already asked for)
            end = min(start + num_new, request.num_prompt_tokens - 1)
            positions = range(max(start, request.num_prompt_logprob_positions), max(end, 0))
            request.num_prompt_logprob_positions = max(request.num_prompt_logprob_positions, positions.stop)
        self.num_prompt_tokens_computed += max(0, min(start + num_new, request.num_prompt_tokens) - start)
        request.num_computed_tokens += num_new
        request.num_pending += samples
        return ScheduledChunk(request.request_id, num_new, start, new_block_ids, samples, positions, new)

    # ------------------------------------------------------------------ speculative decoding
    def _draft_row_budget(self) -> int:
        """Sampler rows left for proposals this step: max_num_seqs less one per running or waiting request."""
        if self.speculative is None:
            return 0
        return max(0, self.config.max_num_seqs - len(self.running) - len(self.waiting))

    def _speculates_now(self, request: Request, num_new: int) -> bool:
        """It decodes (one new token, its newest, whose value is known) and may speculate (not while its grammar
        waits for the end of a reasoning output: proposals could open the gate mid-step)."""
        return (num_new == 1 and request.num_pending == 0 and request.spec is not None and not request.spec.off
                and request.num_computed_tokens == request.num_tokens - 1
                and (request.grammar is None or request.grammar.active))

    def _propose(self, request: Request, max_rows: int) -> list[int]:
        """Its proposals (n-gram ones, or the draft model's made this step): at most k, the rows given, and what
        its length limit leaves after the token verification always yields. A step without
        proposals counts as an eligible step that accepted none."""
        spec = self.speculative
        k = min(spec.num_speculative_tokens, max_rows, request.length_limit - request.num_tokens - 1)
        if self.proposer is not None:
            proposals = self._drafted.get(request.request_id, [])[:max(k, 0)]
        else:
            proposals = propose_ngram(np.asarray(request.all_token_ids, np.int32), k, spec.prompt_lookup_min,
                                      spec.prompt_lookup_max) if k > 0 else ()
        if not len(proposals):
            self._record_acceptance(request, 0)
        return [int(t) for t in proposals]

    def _draft_model_proposals(self, draft_rows: int) -> dict[str, list[int]]:
        """The draft model's proposals, in one batch, for the running requests that speculate this step (in order,
        while sampler rows are left for them); _propose takes them from here."""
        wanted = []
        for request in self.running:
            k = min(self.speculative.num_speculative_tokens, draft_rows,
                    request.length_limit - request.num_tokens - 1)
            if draft_rows <= 0:
                break
            if (k <= 0 or request.num_spec_in_flight or self._finishes_with_pending_token(request)
                    or not self._speculates_now(request, 1)):
                continue
            wanted.append((request.request_id, request.all_token_ids, k))
            draft_rows -= k
        return self.proposer.propose(wanted) if wanted else {}

    def _commit_drafts(self, drafts: dict[str, list[int]], chunks: list[tuple[Request, int]]) -> dict:
        """The proposals of the requests still scheduled (a preemption may have dropped some), now in flight."""
        scheduled = {}
        for request, _ in chunks:
            proposals = drafts.get(request.request_id)
            if proposals:
                request.num_spec_in_flight = len(proposals)
                scheduled[request.request_id] = proposals
        return scheduled

    def _verify(self, request: Request, proposals: list[int], run: list[int]) -> bool:
        """A run of verified tokens (len(run) - 1 proposals accepted): roll back the rejected positions, append
        the run under the stop rules, register the blocks now full. Returns whether the request finished."""
        accepted = len(run) - 1
        request.num_spec_in_flight = 0
        self.spec_stats.observe(len(proposals), accepted)
        self._record_acceptance(request, accepted)
        if request.status.finished:
            return False
        if request.status is RequestStatus.RUNNING:  # a preempted request recomputes from 0 anyway
            request.num_computed_tokens -= len(proposals) - accepted
        for token in run:
            if not self._append_token(request, token):
                return True
            status, reason = self._stop_status(request)
            if status is not None:
                self.finish(request, status, reason)
                return True
        if request.status is RequestStatus.RUNNING:
            self.kv_cache.cache_computed_blocks(request)
        return False

    def _record_acceptance(self, request: Request, accepted: int) -> None:
        """Count an eligible step in its acceptance record; once it stops speculating its draft state and blocks
        are freed (it proposes no more)."""
        request.spec.record(accepted)
        if request.spec.off and self.proposer is not None:
            self.proposer.free(request.request_id)

    def speculating(self) -> bool:
        """Whether a running request may speculate (its steps need the previous step's tokens on the host)."""
        return self.speculative is not None and any(r.spec is not None and not r.spec.off for r in self.running)

    # ------------------------------------------------------------------ stop rules
    def _finishes_with_pending_token(self, request: Request) -> bool:
        """The pending token takes the request to its length limit: it ends when that token arrives."""
        return request.num_pending > 0 and request.num_tokens + request.num_pending >= request.length_limit

    def _admit_waiting(self, chunks: list[tuple[Request, int]], budget: int) -> int:
        skipped: list[Request] = []
        waiting_for_lora = 0
        busy = {r.lora_int_id for r in self.running} if self.lora is not None else set()  # adapters in use
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self._pop_next_waiting()
            if request.num_pending:  # preempted with a token still on its way: readmit once it is known
                skipped.append(request)
                continue
            if request.grammar is not None and not request.grammar.ready:
                skipped.append(request)  # its grammar is being compiled
                continue
            if request.grammar is not None and request.grammar.error is not None:
                self.finish(request, RequestStatus.FINISHED_ABORTED)
                self.failed.append(request)
                continue
            if self.lora is not None and self.lora.acquire(request.lora_int_id, busy) is None:
                skipped.append(request)  # every adapter slot is in use by running requests
                waiting_for_lora += 1
                continue
            first = request.wait_for
            if first is not None and not first.status.finished and not (first.is_prefill_done and
                                                                        first.output_token_ids):
                skipped.append(request)  # let a sibling compute (and cache, when its step is back) the prompt
                continue
            cached = self.kv_cache.find_cached_prefix(request) if request.num_computed_tokens == 0 else []
            num_computed = len(cached) * self.kv_cache.block_size
            num_new = request.num_tokens - num_computed
            if num_new > budget and not self.config.enable_chunked_prefill:
                self._push_front(request)
                break
            num_new = min(num_new, budget)
            if not self.kv_cache.allocate(request, num_new, cached):
                self._push_front(request)
                break
            if request.status is RequestStatus.WAITING:
                request.num_cached_tokens = num_computed
            request.num_computed_tokens = num_computed
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            busy.add(request.lora_int_id)
            chunks.append((request, num_new))
            budget -= num_new
        for request in reversed(skipped):
            self._push_front(request)
        self.num_waiting_for_lora = waiting_for_lora
        return budget

    def _pop_next_waiting(self) -> Request:
        if self.config.policy == "priority":
            best = min(self.waiting, key=lambda r: (r.priority, r.arrival_time))
            self.waiting.remove(best)
            return best
        return self.waiting.popleft()

    def _push_front(self, request: Request) -> None:
        self.waiting.appendleft(request)

    def _lowest_ranked_running(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]  # FCFS: the most recently admitted

    def _preempt(self, victim: Request, chunks: list[tuple[Request, int]]) -> None:
        """Free the victim's blocks and requeue it for recomputation (dropping its chunk if already scheduled);
        the runner drops its copy (SchedulerOutput.preempted_request_ids) and is sent it anew when it runs again."""
        chunks[:] = [(r, n) for r, n in chunks if r is not victim]
        self.running.remove(victim)
        self.kv_cache.free(victim)
        if self.proposer is not None:  # its draft K/V is recomputed when it runs again
            self.proposer.free(victim.request_id)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_blocks_sent = None
        # its proposals in flight (if any) are verified by update() all the same: num_spec_in_flight stays
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self._push_front(victim)

    # ------------------------------------------------------------------ after the model ran
    def update(self, output: SchedulerOutput, sampled: dict[str, int],
               runs: dict[str, list[int]] | None = None) -> list[Request]:
        """The step's results are in: append each sampled token (the request's pending one), register the blocks
        now fully computed with known tokens in the prefix cache, apply the token-level stop rules. `runs`: the
        verified tokens of the requests with proposals (output.scheduled_spec_decode_tokens). Returns the
        requests that finished."""
        finished = []
        drafts = output.scheduled_spec_decode_tokens
        for chunk, request in zip(output.chunks, self._scheduled.pop(output.step_id, [])):
            request.num_pending -= chunk.samples
            if drafts and chunk.request_id in drafts:
                if self._verify(request, drafts[chunk.request_id], runs[chunk.request_id]):
                    finished.append(request)
                continue
            if request.status.finished:  # aborted, or stopped by an earlier step's token, while this one ran
                continue
            if chunk.samples and not self._append_token(request, sampled[chunk.request_id]):
                finished.append(request)
                continue
            if request.status is RequestStatus.RUNNING:
                self.kv_cache.cache_computed_blocks(request)
            if not chunk.samples:
                continue
            status, reason = self._stop_status(request)
            if status is not None:
                self.finish(request, status, reason)
                finished.append(request)
        return finished

    def _append_token(self, request: Request, token: int) -> bool:
        """Append a sampled token to the request's output (its first one's time noted) and advance a constrained
        request's grammar over it; one the grammar does not allow aborts the request (False)."""
        request.append_output(token)
        if request.first_token_time is None:
            request.first_token_time = time.monotonic()
        if request.grammar is None or request.grammar.accept(token):
            return True
        logger.error("request %s: token %d was sampled where its grammar does not allow it: aborted",
                     request.request_id, token)
        self.finish(request, RequestStatus.FINISHED_ABORTED)
        return False

    def _stop_status(self, request: Request) -> tuple[RequestStatus | None, int | None]:
        status, reason = self._stop_status_by_rules(request)
        if status == RequestStatus.FINISHED_STOPPED and request.grammar is not None \
                and request.grammar.closed_by_budget:  # the budget forced its output's end
            return RequestStatus.FINISHED_LENGTH, None
        return status, reason

    def _stop_status_by_rules(self, request: Request) -> tuple[RequestStatus | None, int | None]:
        params = request.sampling_params
        token = request.output_token_ids[-1]
        num_output = len(request.output_token_ids)
        if num_output >= params.min_tokens:
            if token in request.eos_token_ids and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED, None
            if params.stop_token_ids and token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if request.grammar is not None and request.grammar.is_terminated:  # the grammar is complete
            return RequestStatus.FINISHED_STOPPED, None
        if request.num_tokens >= request.length_limit:
            return RequestStatus.FINISHED_LENGTH, None
        return None, None
