"""The runner's own copy of each request it runs, and the host arrays of one step built from it.

A step should cost host work in proportion to what changed since the last one, not to the requests' lengths
(vLLM's runner keeps such a copy too). Per request, CachedRequest holds:

    tokens       [max_model_len] int32   prompt, then outputs as their values arrive from the device
    block_table  [MB] int32              block ids, extended as the scheduler allocates
    sampling     RowSampling             per-request sampling inputs, and its LogitState slot if it needs one

prepare() turns a SchedulerOutput into StepInputs (numpy, padded to the buckets) with vectorized numpy over the
step's tokens; a token whose value is still on the device (the request's pending token, sampled by the step
dispatched just before) gets prev_rows = its row in that step's sampler output instead of a value.
An entry is made when a request is scheduled for the first time (or again, after preemption) and dropped when the
scheduler reports it preempted or finished. A request with logit adjustments (bias, penalties, min_tokens) then
takes one of max_num_seqs LogitState slots; its rows are in StepInputs.logit_writes for the runner to write to the
device before the step samples (the device counts its sampled tokens from there on).

    logits rows:  | sampled rows, chunk order | padding | prompt-logprob rows | padding |
                    0 .. S-1                            S_max ..
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxllm.engine.bucketing import PROMPT_ROWS, Buckets, ProgramKey
from jaxllm.engine.scheduler import NewRequestData, ScheduledChunk, SchedulerOutput
from jaxllm.model import StepBatch
from jaxllm.model.step_batch import lay_out_tokens
from jaxllm.model.kv_cache import NULL_BLOCK
from jaxllm.sampling_batch import LogitState, RowSampling, SamplingBatch, pack_sampling_batch


class CachedRequest:
    def __init__(self, new: NewRequestData, max_len: int, max_blocks: int, vocab_size: int, *, base_seed: int,
                 eos_token_ids: tuple[int, ...]):
        self.request_id = new.request_id
        self.data = new  # prompt and sampling parameters as scheduled; its outputs are those known then
        known = new.prompt_token_ids + new.output_token_ids
        self.tokens = np.zeros(max_len, np.int32)
        self.tokens[:len(known)] = known
        self.num_tokens = len(known)  # tokens whose values are here
        self.block_table = np.full(max_blocks, NULL_BLOCK, np.int32)
        self.num_blocks = 0
        self.sampling = RowSampling(new.sampling_params, len(new.output_token_ids), vocab_size,
                                    base_seed=base_seed, rng_stream=new.rng_stream, eos_token_ids=eos_token_ids,
                                    wants_logprobs=new.needs_sample_logprobs)
        self.sample_row = -1  # its row in the sampler output of the last step that sampled for it

    def add_blocks(self, block_ids: list[int]) -> None:
        self.block_table[self.num_blocks:self.num_blocks + len(block_ids)] = block_ids
        self.num_blocks += len(block_ids)

    def append(self, token: int) -> None:
        self.tokens[self.num_tokens] = token
        self.num_tokens += 1


@dataclasses.dataclass
class PromptSpan:
    """Prompt-logprob rows of one chunk: prompt positions p (their logits score prompt token p + 1)."""

    cached: CachedRequest
    chunk_index: int  # its chunk's position in the step
    first_row: int  # index of its first row within the prompt-logprob rows
    positions: range


@dataclasses.dataclass
class StepInputs:
    forward_key: ProgramKey
    batch: StepBatch  # numpy, padded to the forward's bucket
    prev_rows: np.ndarray  # [T] int32: -1, or the previous step's sampler row holding this token's value
    sampled: list[CachedRequest]  # in sampler-row order
    sample_key: ProgramKey | None
    sampling: SamplingBatch | None  # its state None: the runner's LogitState goes with it
    logit_writes: list[tuple[int, LogitState]]  # (slot, its rows [V]) of requests taken on in this step
    prompt_spans: list[PromptSpan]
    prompt_targets: np.ndarray  # [P'] int32: the token each prompt-logprob row scores (P' % PROMPT_ROWS == 0)


class InputBatch:
    def __init__(self, buckets: Buckets, block_size: int, max_model_len: int, vocab_size: int, *, base_seed: int,
                 eos_token_ids: tuple[int, ...], lora: bool = False):
        """lora: the step batch carries each token's LoRA slot (SchedulerOutput.lora_slot_of)."""
        self.buckets = buckets
        self.lora = lora
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self.vocab_size = vocab_size
        self.base_seed = base_seed
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, CachedRequest] = {}
        self.num_logit_slots = buckets.max_num_seqs  # LogitState slots; slot num_logit_slots is the neutral one
        self._free_slots = list(range(self.num_logit_slots - 1, -1, -1))
        self._logit_writes: list[tuple[int, LogitState]] = []

    def forget(self, request_ids) -> None:
        """Drop the copies of requests that ended or were preempted."""
        for request_id in request_ids:
            cached = self.requests.pop(request_id, None)
            if cached is not None and cached.sampling.slot is not None:
                self._free_slots.append(cached.sampling.slot)

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        self.forget([*out.finished_request_ids, *out.preempted_request_ids])
        chunks = out.chunks
        cached = [self._cached(c) for c in chunks]
        q_lens = np.fromiter((c.num_new_tokens for c in chunks), np.int32, len(chunks))
        starts = np.fromiter((c.num_computed_before for c in chunks), np.int32, len(chunks))
        batch, prev_rows, key = self._step_batch(chunks, cached, q_lens, starts)
        if self.lora:
            batch = batch.replace(lora_slots=self._lora_slots(out, cached, q_lens, len(batch.token_ids)))
        sampled_rows = [i for i, c in enumerate(chunks) if c.samples]
        spans = self._prompt_spans(chunks, cached)
        batch.logits_indices[:len(sampled_rows)] = batch.query_start_loc[sampled_rows] + q_lens[sampled_rows] - 1
        targets = self._prompt_rows(chunks, cached, spans, batch)
        sampled = [cached[i] for i in sampled_rows]
        sample_key = sampling = None
        if sampled:
            sample_key = self.buckets.sample_key(len(sampled))
            sampling = pack_sampling_batch([c.sampling for c in sampled], sample_key.size, self.num_logit_slots)
        writes, self._logit_writes = self._logit_writes, []
        return StepInputs(key, batch, prev_rows, sampled, sample_key, sampling, writes, spans, targets)

    def commit(self, inputs: StepInputs) -> None:
        """The step is dispatched: each sampled request now has a token on its way, in this sampler row."""
        for row, cached in enumerate(inputs.sampled):
            cached.sample_row = row
            cached.sampling.expect_token()

    def _cached(self, chunk: ScheduledChunk) -> CachedRequest:
        if chunk.new is not None:
            self.forget([chunk.request_id])  # a stale copy (an id reused before its end was reported)
            cached = self.requests[chunk.request_id] = CachedRequest(
                chunk.new, self.max_model_len, self.max_blocks, self.vocab_size, base_seed=self.base_seed,
                eos_token_ids=self.eos_token_ids)
            if cached.sampling.needs_state:
                self._take_slot(cached)
        else:
            cached = self.requests.get(chunk.request_id)
            if cached is None:
                raise RuntimeError(f"request {chunk.request_id!r} was scheduled as known to the runner, which "
                                   "holds no copy of it")
        cached.add_blocks(chunk.new_block_ids)
        return cached

    def _take_slot(self, cached: CachedRequest) -> None:
        if not self._free_slots:
            raise RuntimeError(f"all {self.num_logit_slots} logit-adjustment slots are taken: the runner holds more "
                               "requests than max_num_seqs")
        cached.sampling.slot = slot = self._free_slots.pop()
        self._logit_writes.append((slot, cached.sampling.state_rows(cached.data.prompt_token_ids,
                                                                    cached.data.output_token_ids)))

    def _step_batch(self, chunks, cached, q_lens, starts) -> tuple[StepBatch, np.ndarray, ProgramKey]:
        """The forward's arrays, padded to its bucket: T tokens, min(T, max_num_seqs) sequence rows."""
        key = self.buckets.forward_key(int(q_lens.sum()), decode_only=bool(q_lens.max() <= 1))
        num_tokens, num_rows = key.size, self.buckets.num_seq_rows(key.size)
        block_tables = np.full((num_rows, self.max_blocks), NULL_BLOCK, np.int32)
        block_tables[:len(chunks)] = [c.block_table for c in cached]
        positions, slot_mapping, context_lens, query_start_loc = lay_out_tokens(q_lens, starts, block_tables,
                                                                                num_tokens, self.block_size)
        token_ids = np.zeros(num_tokens, np.int32)
        prev_rows = np.full(num_tokens, -1, np.int32)
        for i, c in enumerate(cached):
            first, start, end = query_start_loc[i], starts[i], starts[i] + q_lens[i]
            known_end = min(end, c.num_tokens)
            token_ids[first:first + known_end - start] = c.tokens[start:known_end]
            if known_end < end:  # the chunk ends with the request's pending token: it is still on the device
                assert end - known_end == 1 and c.sample_row >= 0, "at most one pending token, the newest"
                prev_rows[first + q_lens[i] - 1] = c.sample_row
        logits_indices = np.zeros(self.buckets.num_logits_rows, np.int32)
        batch = StepBatch(token_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc,
                          logits_indices, decode_only=key.decode_only)
        return batch, prev_rows, key

    @staticmethod
    def _lora_slots(out: SchedulerOutput, cached: list[CachedRequest], q_lens: np.ndarray,
                    num_tokens: int) -> np.ndarray:
        """[T] int32: each token's adapter slot (its request's), 0 for the base model and for padding."""
        per_chunk = np.fromiter((out.lora_slot_of[c.data.lora_int_id] for c in cached), np.int32, len(cached))
        slots = np.zeros(num_tokens, np.int32)
        slots[:int(q_lens.sum())] = np.repeat(per_chunk, q_lens)
        return slots

    @staticmethod
    def _prompt_spans(chunks, cached) -> list[PromptSpan]:
        """Prompt positions needing logprobs, per chunk, as the scheduler chose them."""
        spans, row = [], 0
        for i, chunk in enumerate(chunks):
            if chunk.prompt_logprob_positions:
                spans.append(PromptSpan(cached[i], i, row, chunk.prompt_logprob_positions))
                row += len(chunk.prompt_logprob_positions)
        return spans

    def _prompt_rows(self, chunks, cached, spans, batch) -> np.ndarray:
        total = spans[-1].first_row + len(spans[-1].positions) if spans else 0
        targets = np.zeros(-(-total // PROMPT_ROWS) * PROMPT_ROWS, np.int32)
        base = self.buckets.num_sample_rows
        for span in spans:
            i = span.chunk_index
            rows = slice(span.first_row, span.first_row + len(span.positions))
            offsets = np.arange(span.positions.start, span.positions.stop) - chunks[i].num_computed_before
            batch.logits_indices[base + rows.start:base + rows.stop] = batch.query_start_loc[i] + offsets
            targets[rows] = cached[i].tokens[span.positions.start + 1:span.positions.stop + 1]
        return targets
