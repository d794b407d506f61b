"""The runner's persistent batch: its own copy of each request it runs, one row of numpy arrays per request, and
the host arrays of one step, gathered from those rows.

A step should cost host work in proportion to what changed since the last one, not to the number of requests or
their lengths (vLLM's persistent batch). A request holds a row from when it is scheduled first (or again, after
preemption) until the scheduler reports it preempted or finished; M = max_num_seqs rows:

    tokens       [M, max_model_len] int32  prompt, then outputs as their values arrive from the device
    num_known    [M] int32                 tokens whose values are in `tokens`
    block_table  [M, MB] int32             block ids, extended as the scheduler allocates
    num_blocks   [M] int32
    sample_row   [M] int32                 its row in the sampler output of the last step that sampled for it
    generation   [M] int64                 bumped when the row changes hands: a step's tokens for the row's
                                           former holder are dropped
    sampling     SamplingTable             its sampling inputs and sampled-token count; its LogitState slot is
                                           its row when it has logit adjustments (bias, penalties, min_tokens)

prepare() turns a SchedulerOutput into StepInputs (numpy, padded to the buckets) with vectorized numpy over the
step's rows and tokens; Python per chunk only finds the row (taking on new requests, adding new blocks). A token
whose value is still on the device (the request's pending token, sampled by the step dispatched just before)
gets prev_rows = its row in that step's sampler output instead of a value. The LogitState rows of requests taken
on are in StepInputs.logit_writes, for the runner to write to the device before the step samples (the device
counts their sampled tokens from there on).

    logits rows:  | sampled rows, chunk order | padding | prompt-logprob rows | padding |
                    0 .. S-1                            S_max ..

Speculative decoding: a chunk with proposals (SchedulerOutput.scheduled_spec_decode_tokens) is the request's
newest token and its proposals; the proposals are written into the row's tokens past num_known (they become
known only if verified) and the chunk has one sampled row per proposal plus one (spec_decode/sampler_rows.py).
The step's verified runs join the rows with record_runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxllm.engine.bucketing import PROMPT_ROWS, Buckets, ProgramKey
from jaxllm.engine.scheduler import NewRequestData, ScheduledChunk, SchedulerOutput
from jaxllm.model import StepBatch
from jaxllm.model.step_batch import lay_out_tokens
from jaxllm.model.kv_cache import NULL_BLOCK
from jaxllm.sampling_batch import LogitState, RowSampling, SamplingBatch, SamplingTable
from jaxllm.spec_decode.sampler_rows import SpecRows, spec_rows


class CachedRequest:
    """A request the runner holds: its row of the batch, and what it was scheduled with."""

    def __init__(self, new: NewRequestData, row: int, batch: InputBatch):
        self.request_id = new.request_id
        self.data = new  # prompt and sampling parameters as scheduled; its outputs are those known then
        self.row = row
        self._batch = batch

    # Its row, read while it holds it (tests and inspection; steps read the batch's arrays).
    @property
    def tokens(self) -> np.ndarray:
        return self._batch.tokens[self.row]

    @property
    def num_tokens(self) -> int:
        return int(self._batch.num_known[self.row])

    @property
    def block_table(self) -> np.ndarray:
        return self._batch.block_table[self.row]

    @property
    def num_blocks(self) -> int:
        return int(self._batch.num_blocks[self.row])

    @property
    def num_output(self) -> int:
        """Tokens sampled for it by the steps dispatched so far (known or still on the device)."""
        return int(self._batch.sampling.num_output[self.row])

    @property
    def slot(self) -> int | None:
        """Its LogitState slot, None if it needs none."""
        slot = int(self._batch.sampling.slot[self.row])
        return None if slot == self._batch.sampling.neutral_slot else slot


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
    sampled_rows: np.ndarray  # [N] their batch rows
    sampled_generations: np.ndarray  # [N] the rows' generations when the step was prepared
    sample_key: ProgramKey | None
    sampling: SamplingBatch | None  # its state None: the runner's LogitState goes with it
    logit_writes: list[tuple[int, LogitState]]  # (slot, its rows [V]) of requests taken on in this step
    prompt_spans: list[PromptSpan]
    prompt_targets: np.ndarray  # [P'] int32: the token each prompt-logprob row scores (P' % PROMPT_ROWS == 0)
    spec: SpecRows | None = None  # a step with proposals: each sampled chunk's sampler rows and proposals


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
        num_rows = buckets.max_num_seqs
        self.num_logit_slots = num_rows  # LogitState slots: a row's own; slot num_logit_slots is the neutral one
        self.tokens = np.zeros((num_rows, max_model_len), np.int32)
        self.num_known = np.zeros(num_rows, np.int32)
        self.block_table = np.full((num_rows, self.max_blocks), NULL_BLOCK, np.int32)
        self.num_blocks = np.zeros(num_rows, np.int32)
        self.sample_row = np.full(num_rows, -1, np.int32)
        self.generation = np.zeros(num_rows, np.int64)
        self.sampling = SamplingTable(num_rows, neutral_slot=self.num_logit_slots)
        self.requests: dict[str, CachedRequest] = {}
        self._free_rows = list(range(num_rows - 1, -1, -1))
        self._logit_writes: list[tuple[int, LogitState]] = []

    def forget(self, request_ids) -> None:
        """Drop the copies of requests that ended or were preempted."""
        for request_id in request_ids:
            cached = self.requests.pop(request_id, None)
            if cached is not None:
                self._free_rows.append(cached.row)

    def prepare(self, out: SchedulerOutput) -> StepInputs:
        self.forget([*out.finished_request_ids, *out.preempted_request_ids])
        chunks = out.chunks
        cached = [self._cached(c) for c in chunks]
        num_chunks = len(chunks)
        rows = np.fromiter((c.row for c in cached), np.intp, num_chunks)  # [N]
        q_lens = np.fromiter((c.num_new_tokens for c in chunks), np.int32, num_chunks)  # [N]
        starts = np.fromiter((c.num_computed_before for c in chunks), np.int32, num_chunks)  # [N]
        samples = np.fromiter((c.samples for c in chunks), bool, num_chunks)  # [N]
        drafts = out.scheduled_spec_decode_tokens
        num_drafts = self._write_proposals(chunks, rows, drafts) if drafts else None  # [N]
        batch, prev_rows, key = self._step_batch(rows, q_lens, starts, num_drafts)
        if self.lora:
            batch = batch.replace(lora_slots=self._lora_slots(out, cached, q_lens, len(batch.token_ids)))
        sampled_chunks = np.flatnonzero(samples)  # [N'] in chunk order
        spec = None
        if num_drafts is None:
            batch.logits_indices[:len(sampled_chunks)] = \
                batch.query_start_loc[sampled_chunks] + q_lens[sampled_chunks] - 1
        else:
            proposals = [drafts.get(chunks[i].request_id, ()) for i in sampled_chunks.tolist()]
            spec, logits_rows, chunk_of_row, offsets = spec_rows(sampled_chunks, num_drafts, batch.query_start_loc,
                                                                 q_lens, proposals)
            batch.logits_indices[:len(logits_rows)] = logits_rows
        spans = self._prompt_spans(chunks, cached)
        targets = self._prompt_rows(chunks, spans, batch)
        sampled_rows = rows[sampled_chunks]
        sample_key = sampling = None
        if spec is not None:
            sample_key = self.buckets.sample_key(spec.num_rows)
            sampling = self.sampling.pack(rows[chunk_of_row], sample_key.size, offsets)
        elif len(sampled_rows):
            sample_key = self.buckets.sample_key(len(sampled_rows))
            sampling = self.sampling.pack(sampled_rows, sample_key.size)
        writes, self._logit_writes = self._logit_writes, []
        return StepInputs(key, batch, prev_rows, [cached[i] for i in sampled_chunks.tolist()], sampled_rows,
                          self.generation[sampled_rows], sample_key, sampling, writes, spans, targets, spec)

    def commit(self, inputs: StepInputs) -> None:
        """The step is dispatched: each sampled request now has a token on its way, in this sampler row."""
        rows = inputs.sampled_rows
        self.sample_row[rows] = np.arange(len(rows)) if inputs.spec is None else inputs.spec.first_rows
        self.sampling.advance(rows)

    def record_sampled(self, inputs: StepInputs, tokens: np.ndarray) -> None:
        """The step's sampled tokens [N] (sampler-row order) join their requests' rows; a row that changed hands
        since the step was prepared (its request ended or was preempted) is left alone."""
        held = self.generation[inputs.sampled_rows] == inputs.sampled_generations
        rows = inputs.sampled_rows[held]
        self.tokens[rows, self.num_known[rows]] = tokens[held]
        self.num_known[rows] += 1

    def record_runs(self, inputs: StepInputs, runs: list[np.ndarray]) -> None:
        """A step with proposals: each sampled chunk's verified run (1 + its accepted proposals) joins its row, and
        the row's noise counter moves on past the accepted ones (commit counted one)."""
        held = self.generation[inputs.sampled_rows] == inputs.sampled_generations
        for row, run in zip(inputs.sampled_rows[held].tolist(), [r for r, h in zip(runs, held) if h]):
            known = self.num_known[row]
            self.tokens[row, known:known + len(run)] = run
            self.num_known[row] += len(run)
            self.sampling.num_output[row] += len(run) - 1

    def _write_proposals(self, chunks, rows: np.ndarray, drafts: dict[str, list[int]]) -> np.ndarray:
        """[N] each chunk's proposals, written into its row's tokens past the known ones."""
        num_drafts = np.zeros(len(chunks), np.int32)
        for i, chunk in enumerate(chunks):
            proposals = drafts.get(chunk.request_id)
            if proposals:
                row, known = rows[i], self.num_known[rows[i]]
                self.tokens[row, known:known + len(proposals)] = proposals
                num_drafts[i] = len(proposals)
        return num_drafts

    def _cached(self, chunk: ScheduledChunk) -> CachedRequest:
        if chunk.new is not None:
            cached = self._take_on(chunk.new)
        else:
            cached = self.requests.get(chunk.request_id)
            if cached is None:
                raise RuntimeError(f"request {chunk.request_id!r} was scheduled as known to the runner, which "
                                   "holds no copy of it")
        if chunk.new_block_ids:
            row, count = cached.row, self.num_blocks[cached.row]
            self.block_table[row, count:count + len(chunk.new_block_ids)] = chunk.new_block_ids
            self.num_blocks[row] += len(chunk.new_block_ids)
        return cached

    def _take_on(self, new: NewRequestData) -> CachedRequest:
        """A row for a request the runner does not hold: its known tokens, its sampling inputs, its LogitState
        rows (written by the runner) if it needs a slot."""
        self.forget([new.request_id])  # a stale copy (an id reused before its end was reported)
        if not self._free_rows:
            raise RuntimeError(f"all {len(self.num_known)} rows are taken: the runner holds more requests than "
                               "max_num_seqs")
        row = self._free_rows.pop()
        known = new.prompt_token_ids + new.output_token_ids
        self.tokens[row, :len(known)] = known
        self.num_known[row] = len(known)
        self.block_table[row] = NULL_BLOCK
        self.num_blocks[row] = 0
        self.sample_row[row] = -1
        self.generation[row] += 1
        sampling = RowSampling(new.sampling_params, len(new.output_token_ids), self.vocab_size,
                               base_seed=self.base_seed, rng_stream=new.rng_stream,
                               eos_token_ids=self.eos_token_ids, wants_logprobs=new.needs_sample_logprobs)
        if sampling.needs_state:
            sampling.slot = row
            self._logit_writes.append((row, sampling.state_rows(new.prompt_token_ids, new.output_token_ids)))
        self.sampling.set_row(row, sampling)
        cached = self.requests[new.request_id] = CachedRequest(new, row, self)
        return cached

    def _step_batch(self, rows, q_lens, starts, num_drafts=None) -> tuple[StepBatch, np.ndarray, ProgramKey]:
        """The forward's arrays, padded to its bucket: T tokens, min(T, max_num_seqs) sequence rows; num_drafts
        [N] (or None): the proposals each chunk ends with, whose values are in the rows past num_known."""
        key = self.buckets.forward_key(int(q_lens.sum()), decode_only=bool(q_lens.max() <= 1))
        num_tokens, num_rows = key.size, self.buckets.num_seq_rows(key.size)
        block_tables = np.full((num_rows, self.max_blocks), NULL_BLOCK, np.int32)  # [S, MB]
        block_tables[:len(rows)] = self.block_table[rows]
        positions, slot_mapping, context_lens, query_start_loc = lay_out_tokens(q_lens, starts, block_tables,
                                                                                num_tokens, self.block_size)
        token_ids, prev_rows = self._token_ids(rows, q_lens, positions, num_drafts)
        logits_indices = np.zeros(self.buckets.num_logits_rows, np.int32)
        batch = StepBatch(token_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc,
                          logits_indices, decode_only=key.decode_only)
        return batch, prev_rows, key

    def _token_ids(self, rows, q_lens, positions, num_drafts=None) -> tuple[np.ndarray, np.ndarray]:
        """[T] each token's id where its value is here (0 elsewhere); [T] prev_rows: the previous step's sampler
        row where the value is still on the device (-1 elsewhere)."""
        total = int(q_lens.sum())
        row_of = np.repeat(rows, q_lens)  # [total] each token's batch row
        pos = positions[:total]
        known = pos < self.num_known[row_of]  # [total]
        if num_drafts is not None:  # proposals: their values are in the rows, past num_known
            known = pos < self.num_known[row_of] + np.repeat(num_drafts, q_lens)
        token_ids = np.zeros(len(positions), np.int32)
        token_ids[:total] = np.where(known, self.tokens[row_of, pos], 0)
        prev_rows = np.full(len(positions), -1, np.int32)
        pending = np.flatnonzero(~known)
        if len(pending):
            pending_rows = row_of[pending]
            assert (pos[pending] == self.num_known[pending_rows]).all() and \
                (self.sample_row[pending_rows] >= 0).all(), "at most one pending token per request, its newest"
            prev_rows[pending] = self.sample_row[pending_rows]
        return token_ids, prev_rows

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

    def _prompt_rows(self, chunks, spans, batch) -> np.ndarray:
        total = spans[-1].first_row + len(spans[-1].positions) if spans else 0
        targets = np.zeros(-(-total // PROMPT_ROWS) * PROMPT_ROWS, np.int32)
        base = self.buckets.num_sample_rows
        for span in spans:
            i = span.chunk_index
            rows = slice(span.first_row, span.first_row + len(span.positions))
            offsets = np.arange(span.positions.start, span.positions.stop) - chunks[i].num_computed_before
            batch.logits_indices[base + rows.start:base + rows.stop] = batch.query_start_loc[i] + offsets
            targets[rows] = span.cached.data.prompt_token_ids[span.positions.start + 1:span.positions.stop + 1]
        return targets
