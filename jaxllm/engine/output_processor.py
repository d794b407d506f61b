"""Turns per-step engine results into RequestOutputs: detokenization, stop strings, logprobs, n > 1 fan-in.

A user request with n samples runs as n engine requests ("child" ids `{i}_{request_id}`); this module keeps one
RequestState per child and assembles the parent's RequestOutput from all of them.

With best_of > n it runs best_of children and reports nothing until all have finished; then one output holds
the n with the highest cumulative logprob, whole (whatever the output kind), best first, numbered 0 .. n-1.
"""

from __future__ import annotations

import dataclasses
import time

from jaxllm.detokenizer import IncrementalDetokenizer
from jaxllm.engine.request import Request, RequestStatus
from jaxllm.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestMetrics, RequestOutput, SampleLogprobs

OUTPUT_KINDS = ("cumulative", "delta", "final")


@dataclasses.dataclass
class SampleResult:
    """One sampled token as the runner reports it."""

    token_id: int
    logprob: float  # the sampled token's logprob under the model's raw distribution
    rank: int  # 1 = the model's most likely token
    top: list[tuple[int, float]]  # the top-N (token id, logprob), N = the request's `logprobs`


@dataclasses.dataclass(eq=False)
class RequestState:
    request: Request
    detokenizer: IncrementalDetokenizer | None
    logprobs: SampleLogprobs | None  # only when the request asked for logprobs
    cumulative_logprob: float | None  # when logprobs were asked for, or the sample is ranked (best_of > n)
    sent_tokens: int = 0  # tokens already reported (delta mode)
    unsent_text: str = ""  # text deltas not yet reported (delta mode): never text a stop string may retract
    finish_sent: bool = False  # its finish reason has been reported (delta mode: once)


@dataclasses.dataclass(eq=False)
class ParentState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[RequestState]
    output_kind: str
    metrics: RequestMetrics
    prompt_logprobs: PromptLogprobs | None = None
    num_returned: int = 1  # n: with best_of > n children, only the n best are returned

    @property
    def ranked(self) -> bool:
        return len(self.children) > self.num_returned

    @property
    def finished(self) -> bool:
        for child in self.children:  # a loop, not all(genexpr): asked for every request at every step
            if not child.request.status.finished:
                return False
        return True


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.parents: dict[str, ParentState] = {}
        self.child_parent: dict[str, ParentState] = {}

    def add(self, parent_id: str, prompt: str | None, children: list[Request], output_kind: str,
            num_returned: int | None = None) -> None:
        """Track a user request run as `children`; the best `num_returned` of them (None: all) are returned."""
        states = [self._state(child) for child in children]
        first = children[0]
        parent = ParentState(parent_id, prompt, first.prompt_token_ids, states, output_kind,
                             RequestMetrics(arrival_time=first.arrival_time),
                             [None] if first.sampling_params.prompt_logprobs is not None else None,
                             len(children) if num_returned is None else num_returned)
        self.parents[parent_id] = parent
        for child in children:
            self.child_parent[child.request_id] = parent

    def _state(self, request: Request) -> RequestState:
        params = request.sampling_params
        detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params) \
            if self.tokenizer is not None and params.detokenize else None
        return RequestState(request, detok, [] if params.logprobs is not None else None,
                            0.0 if request.needs_sample_logprobs else None)

    def record_sample(self, request: Request, token_id: int, result: SampleResult | None,
                      last: bool = True) -> str | None:
        """Account for the token the scheduler just appended (`result`: its logprobs, there when the request needs
        them); returns the stop string it completed, if any. last: False for a token of a verified run that
        others follow (the request's end, if it ended, is at the run's last token)."""
        state = self._child_state(request)
        if state.logprobs is not None:
            asked = bool(request.sampling_params.logprob_token_ids)  # then no rank: the ids are the user's
            entry = {tid: Logprob(lp, rank=None if asked else i + 1, decoded_token=self._decode_one(tid))
                     for i, (tid, lp) in enumerate(result.top)}
            entry.setdefault(token_id, Logprob(result.logprob, result.rank, self._decode_one(token_id)))
            state.logprobs.append(entry)
        if state.cumulative_logprob is not None:
            state.cumulative_logprob += result.logprob
        if state.detokenizer is None:
            return None
        status = request.status
        stop_terminated = last and status is RequestStatus.FINISHED_STOPPED  # EOS or a stop token id ended it
        state.unsent_text += state.detokenizer.update([token_id], finished=last and status.finished,
                                                      stop_terminated=stop_terminated)
        return state.detokenizer.finished_by_stop

    def record_prompt_logprobs(self, request: Request, entries: PromptLogprobs) -> None:
        parent = self.child_parent[request.request_id]
        if parent.prompt_logprobs is not None and parent.children[0].request is request:
            parent.prompt_logprobs.extend(entries)

    def outputs_for(self, requests: list[Request]) -> list[RequestOutput]:
        """RequestOutputs for the parents of `requests` (which made progress or finished this step)."""
        now = time.monotonic()
        results, seen = [], set()
        for request in requests:
            parent = self.child_parent.get(request.request_id)
            if parent is None or parent in seen:
                continue
            seen.add(parent)
            finished = self._update_metrics(parent, now)
            if (parent.output_kind == "final" or parent.ranked) and not finished:
                continue
            results.append(self._assemble(parent, finished))
            if finished:
                self._forget(parent)
        return results

    def _assemble(self, parent: ParentState, finished: bool) -> RequestOutput:
        completions = self._best_completions(parent) if parent.ranked else self._completions(parent)
        if finished:
            parent.metrics.num_preemptions = sum(child.request.num_preemptions for child in parent.children)
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, parent.prompt_logprobs,
                             completions, finished, parent.metrics,
                             num_cached_tokens=parent.children[0].request.num_cached_tokens)

    def _completions(self, parent: ParentState) -> list[CompletionOutput]:
        """Every child's completion (delta: only those with something new to report)."""
        delta = parent.output_kind == "delta"
        completions = []
        for state in parent.children:
            request = state.request
            if delta and state.sent_tokens == len(request.output_token_ids) and \
                    (state.finish_sent or not request.status.finished):
                continue
            completions.append(self._completion(state, delta))
        return completions

    def _best_completions(self, parent: ParentState) -> list[CompletionOutput]:
        """The n finished children with the highest cumulative logprob, whole, best first, renumbered 0 .. n-1."""
        best = sorted(parent.children, key=lambda state: state.cumulative_logprob, reverse=True)
        return [dataclasses.replace(self._completion(state, delta=False), index=i)
                for i, state in enumerate(best[:parent.num_returned])]

    def _completion(self, state: RequestState, delta: bool) -> CompletionOutput:
        request = state.request
        text = state.detokenizer.output_text if state.detokenizer is not None else ""
        tokens = request.output_token_ids
        logprobs = state.logprobs
        if delta:
            text, tokens = state.unsent_text, tokens[state.sent_tokens:]
            logprobs = None if logprobs is None else logprobs[state.sent_tokens:]
            state.unsent_text = ""
            state.sent_tokens += len(tokens)
            state.finish_sent = request.status.finished
        finish = request.status.value if request.status.finished else None
        return CompletionOutput(request.sample_index, text, list(tokens), state.cumulative_logprob, logprobs,
                                finish, request.stop_reason)

    @staticmethod
    def _update_metrics(parent: ParentState, now: float) -> bool:
        """-> whether every child has finished."""
        metrics = parent.metrics
        if metrics.first_token_time is None:
            firsts = [c.request.first_token_time for c in parent.children if c.request.first_token_time]
            metrics.first_token_time = min(firsts) if firsts else None
        metrics.last_token_time = now
        finished = parent.finished
        if finished:
            metrics.finished_time = now
        return finished

    def mark_scheduled(self, request: Request, now: float) -> None:
        parent = self.child_parent.get(request.request_id)
        if parent is not None and parent.metrics.first_scheduled_time is None:
            parent.metrics.first_scheduled_time = now

    def _child_state(self, request: Request) -> RequestState:
        parent = self.child_parent[request.request_id]
        return parent.children[request.sample_index]

    def _decode_one(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])

    def forget(self, parent_id: str) -> None:
        parent = self.parents.get(parent_id)
        if parent is not None:
            self._forget(parent)

    def _forget(self, parent: ParentState) -> None:
        del self.parents[parent.request_id]
        for state in parent.children:
            self.child_parent.pop(state.request.request_id, None)

    def abort(self, parent_id: str) -> list[Request]:
        """Children of a user request that are still unfinished (the engine aborts them)."""
        parent = self.parents.get(parent_id)
        if parent is None:
            return []
        return [c.request for c in parent.children if not c.request.status.finished]
