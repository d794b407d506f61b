"""The scheduler counts tokens, not phases: every step moves each chosen request's num_computed_tokens toward
its num_tokens within a token budget (max_num_batched_tokens) and a sequence budget (max_num_seqs).

    step:  running requests first (decodes and unfinished prefill chunks), in order
           -> then waiting requests (FCFS, or by priority), prefix-cache hits first, long prompts chunked
           -> when the pool runs dry, the lowest-ranked running request is preempted: its blocks are freed and it
              goes back to the front of the waiting queue, to be recomputed (its output so far is kept)

Host-only: the output is plain data (SchedulerOutput) that the runner turns into device arrays.

Scheduling commits a step: each chunk's tokens count as computed at once, and a chunk that samples leaves its
request one pending token (sampled on the device, value not yet known here). So the next step can be scheduled
before this one's tokens come back (async scheduling): a request whose newest token is pending computes it next
(the runner feeds it from the device), and update() later appends its value and applies the stop rules. A step
scheduled ahead may give a request one token too many (it hit EOS meanwhile): that token is dropped, never
reported. Requests at their length limit with a token pending are not scheduled ahead; a preempted request
keeps its pending token (update appends it while it waits) and is not admitted again before it arrives.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from jaxllm.config import SchedulerConfig
from jaxllm.engine.block_pool import Block
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.request import Request, RequestStatus
from jaxllm.lora.manager import LoRAManager


@dataclasses.dataclass
class ScheduledChunk:
    request: Request
    num_new_tokens: int
    num_computed_before: int  # tokens already in the pool: the chunk starts at this position
    blocks: list[Block]  # the request's blocks (the KV cache manager's list, not a copy)
    samples: bool  # the chunk reaches the request's newest token, so a new token is sampled after it

    @classmethod
    def of(cls, request: Request, num_new_tokens: int, blocks: list[Block]) -> "ScheduledChunk":
        start = request.num_computed_tokens
        return cls(request, num_new_tokens, start, blocks,
                   start + num_new_tokens >= request.num_tokens + request.num_pending)


@dataclasses.dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk]  # running requests first, then newly admitted ones
    preempted: list[Request]
    finished_request_ids: list[str] = dataclasses.field(default_factory=list)  # ended since the last schedule
    lora_loads: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (slot, lora id) to write first
    lora_slot_of: dict[int, int] = dataclasses.field(default_factory=lambda: {0: 0})  # lora id -> its slot

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, lora: LoRAManager | None = None):
        """lora: the adapters' manager when LoRA is on: a waiting request is admitted only once its adapter has a
        device slot (LoRAManager.acquire); otherwise it waits, and requests behind it may go first."""
        self.config = config
        self.kv_cache = kv_cache
        self.lora = lora
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []  # ended since the last schedule (the runner drops their state)

    # ------------------------------------------------------------------ requests in and out
    def add_request(self, request: Request) -> None:
        """Queue a request; raises ValueError if it could never run (its full length exceeds the context or the
        pool), so nothing is left waiting forever."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        total = request.max_total_tokens(self.config.max_model_len)
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
        request.finished_time = time.monotonic()
        self.kv_cache.forget(request)
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
        chunks: list[ScheduledChunk] = []
        preempted: list[Request] = []

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if self._finishes_with_pending_token(request):
                index += 1
                continue
            num_new = min(request.num_tokens + request.num_pending - request.num_computed_tokens, budget)
            while not self.kv_cache.allocate(request, num_new):
                victim = self._lowest_ranked_running()
                self._preempt(victim, chunks)
                preempted.append(victim)
                budget = self.config.max_num_batched_tokens - sum(c.num_new_tokens for c in chunks)
                if victim is request:
                    break
                index = min(index, self.running.index(request))
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted itself: `index` now points at the next request
            chunks.append(ScheduledChunk.of(request, num_new, self.kv_cache.blocks(request)))
            budget -= num_new
            index += 1

        if not preempted:  # admitting while others are being evicted would only thrash
            budget = self._admit_waiting(chunks, budget)
        for chunk in chunks:  # commit: the chunk's tokens count as computed, its sample as pending
            chunk.request.num_computed_tokens += chunk.num_new_tokens
            chunk.request.num_pending += chunk.samples
        finished, self._finished_ids = self._finished_ids, []
        out = SchedulerOutput(chunks, preempted, finished)
        if self.lora is not None:
            out.lora_loads, out.lora_slot_of = self.lora.take_loads(), {0: 0, **self.lora.slots}
        return out

    def _finishes_with_pending_token(self, request: Request) -> bool:
        """The pending token takes the request to its length limit: it ends when that token arrives."""
        return request.num_pending > 0 and \
            request.num_tokens + request.num_pending >= request.max_total_tokens(self.config.max_model_len)

    def _admit_waiting(self, chunks: list[ScheduledChunk], budget: int) -> int:
        skipped: list[Request] = []
        busy = {r.lora_int_id for r in self.running} if self.lora is not None else set()  # adapters in use
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self._pop_next_waiting()
            if request.num_pending:  # preempted with a token still on its way: readmit once it is known
                skipped.append(request)
                continue
            if self.lora is not None and self.lora.acquire(request.lora_int_id, busy) is None:
                skipped.append(request)  # every adapter slot is in use by running requests
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
            chunks.append(ScheduledChunk.of(request, num_new, self.kv_cache.blocks(request)))
            budget -= num_new
        for request in reversed(skipped):
            self._push_front(request)
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

    def _preempt(self, victim: Request, chunks: list[ScheduledChunk]) -> None:
        """Free the victim's blocks and requeue it for recomputation (dropping its chunk if already scheduled)."""
        chunks[:] = [c for c in chunks if c.request is not victim]
        self.running.remove(victim)
        self.kv_cache.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self._push_front(victim)

    # ------------------------------------------------------------------ after the model ran
    def update(self, output: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """The step's results are in: append each sampled token (the request's pending one), register the blocks
        now fully computed with known tokens in the prefix cache, apply the token-level stop rules. Returns the
        requests that finished."""
        finished = []
        for chunk in output.chunks:
            request = chunk.request
            request.num_pending -= chunk.samples
            if request.status.finished:  # aborted, or stopped by an earlier step's token, while this one ran
                continue
            if chunk.samples:
                request.append_output(sampled[request.request_id])
                if request.first_token_time is None:
                    request.first_token_time = time.monotonic()
            if request.status is RequestStatus.RUNNING:
                self.kv_cache.cache_computed_blocks(request)
            if not chunk.samples:
                continue
            status, reason = self._stop_status(request)
            if status is not None:
                self.finish(request, status, reason)
                finished.append(request)
        return finished

    def _stop_status(self, request: Request) -> tuple[RequestStatus | None, int | None]:
        params = request.sampling_params
        token = request.output_token_ids[-1]
        num_output = len(request.output_token_ids)
        if num_output >= params.min_tokens:
            if token in request.eos_token_ids and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED, None
            if params.stop_token_ids and token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if request.num_tokens >= request.max_total_tokens(self.config.max_model_len):
            return RequestStatus.FINISHED_LENGTH, None
        return None, None
