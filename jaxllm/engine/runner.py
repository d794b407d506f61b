"""ModelRunner: the only owner of device state (params, KV pool) and of the step's compiled programs.

    dispatch(SchedulerOutput):
        adapters newly assigned to LoRA slots written into them (one compiled program, slots donated)
        InputBatch.prepare -> StepInputs (numpy, padded to the buckets)
        logit-adjustment rows of requests taken on written into their LogitState slots (state donated)
        -> forward program (kv donated) -> hidden rows [R, H], on the device
        -> sampler program over the sampled rows' logits, reading and counting into the LogitState (donated);
           prompt-logprob program over the prompt rows
        returns an InflightStep at once: nothing waits for the device
    dispatch(SchedulerOutput, defer_sample=True): the same, but the sampler waits for sample(step, bitmask):
        the token bitmask of constrained rows (structured outputs) is known only once the host has the previous
        step's tokens, so the forward goes ahead and only the sampling waits
    fetch(InflightStep): the step's one device-to-host copy -> StepResults (tokens, logprobs where asked for)

Between the two the engine may dispatch the next step (async scheduling): its pending tokens are read by the
forward program from this step's sampled tokens, which stay on the device.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxllm.config import CacheConfig, SchedulerConfig
from jaxllm.engine.bucketing import PROMPT_ROWS, Buckets, ProgramKey
from jaxllm.engine.input_batch import InputBatch, StepInputs
from jaxllm.engine.output_processor import SampleResult
from jaxllm.engine.scheduler import NewRequestData, SchedulerOutput
from jaxllm.engine.step_programs import PROMPT_LOGPROBS_KEY, WRITE_LOGIT_ROWS_KEY, StepPrograms
from jaxllm.lora import device_slots
from jaxllm.lora.manager import LoRAManager
from jaxllm.model.tensor_parallel import default_mesh, init_kv_cache
from jaxllm.model.kernels import Kernels, select_kernels
from jaxllm.model.tiled_params import tile_params
from jaxllm.model.params import params_dtype
from jaxllm.outputs import Logprob, PromptLogprobs
from jaxllm.sampling_batch import bitmask_width, empty_logit_state
from jaxllm.spec_decode.rejection import accept_run


@dataclasses.dataclass
class TokenCounts:
    """Tokens the forward programs were given (scheduled) and computed (their T buckets, padding included)."""
    scheduled: int = 0
    computed: int = 0

    def add(self, scheduled: int, computed: int) -> None:
        self.scheduled += scheduled
        self.computed += computed

    @property
    def padded_fraction(self) -> float:
        """Share of the computed token rows that were padding."""
        return 1.0 - self.scheduled / self.computed if self.computed else 0.0


@dataclasses.dataclass
class StepResults:
    """What a step sampled, by request id."""

    tokens: dict[str, int]  # every request the step sampled for without proposals
    logprobs: dict[str, SampleResult]  # those that need their tokens' logprobs (asked for, or ranked)
    prompt_logprobs: dict[str, PromptLogprobs]
    spec_tokens: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # verified runs (proposals)
    spec_logprobs: dict[str, list[SampleResult]] = dataclasses.field(default_factory=dict)  # their logprobs


@dataclasses.dataclass
class InflightStep:
    inputs: StepInputs
    sampled: object | None  # SamplerOutput of device arrays, or None when no chunk sampled
    prompt_out: list[tuple]  # per PROMPT_ROWS rows: (logprob, rank, top ids, top logprobs), device arrays
    hidden: object | None = None  # the forward's hidden rows while the sampler waits for its bitmask

    @property
    def awaits_bitmask(self) -> bool:
        return self.hidden is not None


class ModelRunner:
    def __init__(self, loaded, cache: CacheConfig, scheduler: SchedulerConfig, *, seed: int = 0,
                 kernels: Kernels | None = None, eos_token_ids: tuple[int, ...] = (), mesh: Mesh | None = None,
                 lora: LoRAManager | None = None):
        """`mesh`: the device mesh loaded.params lie on (tensor_parallel.shard_params; None: default_mesh(), one
        device); the KV pool is split over it too. `lora`: None, or the adapters' manager (LoRA enabled): the runner
        then holds its max_loras device slots. `kernels`: the implementation of each custom operation
        (model/kernels.py); None: each one's "auto" choice."""
        self.kernels = select_kernels() if kernels is None else kernels
        self.config = loaded.config
        self.mesh = mesh = mesh or default_mesh()
        self.params = tile_params(loaded.params, self.kernels, mesh.size)  # AMX tiles where their kernel runs
        dtype = params_dtype(self.params)
        self.kv = init_kv_cache(self.config, cache.num_blocks, cache.block_size, dtype, mesh)
        self.buckets = Buckets(scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
                               decode_only_programs=self.kernels.attention == "pallas")
        self.inputs = InputBatch(self.buckets, cache.block_size, scheduler.max_model_len, self.config.vocab_size,
                                 base_seed=seed, eos_token_ids=eos_token_ids, lora=lora is not None)
        self.lora = lora
        self.lora_slots = None if lora is None else device_slots.init_slots(
            self.config, lora.max_loras, lora.max_lora_rank, dtype, mesh)
        self._write_slot = None if lora is None else device_slots.slot_writer(mesh, self.config.num_layers)
        self.programs = StepPrograms(self.config, self.kernels, self.buckets, self.inputs.max_blocks, mesh,
                                     lora_slots=_abstract_placed(self.lora_slots))
        replicated = NamedSharding(mesh, PartitionSpec())
        self.logit_state = jax.device_put(empty_logit_state(self.inputs.num_logit_slots, self.config.vocab_size),
                                          replicated)
        self._next_tokens = jax.device_put(np.zeros(self.buckets.num_sample_rows, np.int32))  # last step's samples
        self.bitmask_width = bitmask_width(self.config.vocab_size)
        self._all_allowed: dict[int, jax.Array] = {}  # [S, W] every bit set, per sampler bucket, on the device
        self._awaiting: InflightStep | None = None  # the step whose sampler waits for its bitmask
        self.token_counts = TokenCounts()

    @property
    def programs_used(self) -> set[ProgramKey]:
        return self.programs.used

    @property
    def num_compiled_programs(self) -> int:
        return len(self.programs.compiled)

    def warmup(self) -> None:
        """Build every program of the bucket set: after this no step compiles anything."""
        self.programs.compile_all(self.params, self.kv)
        if self.lora is not None:
            slot = jax.ShapeDtypeStruct((), np.int32)
            adapter = device_slots.abstract_adapter(self.lora_slots, NamedSharding(self.mesh, PartitionSpec()))
            self._write_slot = self._write_slot.lower(_abstract_placed(self.lora_slots), slot, adapter).compile()

    def forget(self, request_ids) -> None:
        """Drop what is kept for requests that ended (dispatch does this for the ids a schedule reports)."""
        self.inputs.forget(request_ids)

    def dispatch(self, out: SchedulerOutput, defer_sample: bool = False) -> InflightStep:
        """Send the step to the device; with defer_sample its sampler waits for sample(step, bitmask)."""
        if self._awaiting is not None:
            raise RuntimeError("a step was dispatched while the previous one waits for its token bitmask: its "
                               "forward would read tokens not sampled yet")
        self._load_adapters(out.lora_loads)
        inputs = self.inputs.prepare(out)
        for slot, rows in inputs.logit_writes:
            self.logit_state = self.programs.run(WRITE_LOGIT_ROWS_KEY, self.logit_state, np.int32(slot), rows)
        self.token_counts.add(out.num_tokens, inputs.forward_key.size)
        hidden, self.kv = self.programs.run(inputs.forward_key, self.params, self.kv, inputs.batch,
                                            self._next_tokens, inputs.prev_rows, self.lora_slots)
        step = InflightStep(inputs, None, [])
        if inputs.sample_key is not None and defer_sample:
            step.hidden = hidden
        elif inputs.sample_key is not None:
            self._sample(step, hidden, None)
        for first in range(0, len(inputs.prompt_targets), PROMPT_ROWS):
            step.prompt_out.append(self.programs.run(PROMPT_LOGPROBS_KEY, self.params, hidden,
                                                np.int32(self.buckets.num_sample_rows + first),
                                                inputs.prompt_targets[first:first + PROMPT_ROWS]))
        self.inputs.commit(inputs)
        self._awaiting = step if defer_sample and step.hidden is not None else None
        return step

    def sample(self, step: InflightStep, bitmask: np.ndarray) -> None:
        """Dispatch the sampler of a step that waits for its bitmask [N, W] int32 (N: the step's sampled rows, in
        order; every bit set in unconstrained rows)."""
        if step is not self._awaiting:
            raise RuntimeError("sample() is for the dispatched step that waits for its token bitmask")
        num_rows = step.inputs.sample_key.size
        padded = np.full((num_rows, self.bitmask_width), -1, np.int32)  # [S, W]
        padded[:len(bitmask)] = bitmask
        hidden, step.hidden, self._awaiting = step.hidden, None, None
        self._sample(step, hidden, padded)

    def _sample(self, step: InflightStep, hidden, bitmask: np.ndarray | None) -> None:
        inputs = step.inputs
        constrained = bitmask is not None
        if not constrained:
            bitmask = self._all_allowed_rows(inputs.sample_key.size)
        sampling = inputs.sampling.replace(token_bitmask=bitmask, has_bitmask=np.asarray(constrained))
        step.sampled, self._next_tokens, self.logit_state = self.programs.run(
            inputs.sample_key, self.params, hidden, sampling, self.logit_state)

    def _all_allowed_rows(self, num_rows: int) -> jax.Array:
        """[S, W] every bit set, kept on the device (a plain step sends no bitmask)."""
        if num_rows not in self._all_allowed:
            self._all_allowed[num_rows] = jax.device_put(np.full((num_rows, self.bitmask_width), -1, np.int32),
                                                         NamedSharding(self.mesh, PartitionSpec()))
        return self._all_allowed[num_rows]

    def _load_adapters(self, loads: list[tuple[int, int]]) -> None:
        """Write each (slot, lora id) the scheduler assigned into its device slot, before the step reads it (lora
        id 0: zeros, the slot of an adapter that was removed)."""
        for slot, lora_int_id in loads:
            if lora_int_id == 0:  # a freed slot: zeroed
                adapter = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), device_slots.abstract_adapter(
                    self.lora_slots))
            else:
                adapter = device_slots.lay_out(self.lora.host_adapter(lora_int_id), self.config, self.mesh.size)
            # the write program takes the adapter replicated over the mesh
            adapter = jax.device_put(adapter, NamedSharding(self.mesh, PartitionSpec()))
            self.lora_slots = self._write_slot(self.lora_slots, np.int32(slot), adapter)

    def fetch(self, step: InflightStep) -> StepResults:
        """Wait for the step; the sampled tokens join the runner's copies of their requests."""
        if step.awaits_bitmask:
            raise RuntimeError("the step's sampler waits for its token bitmask (sample(step, bitmask) first)")
        inputs = step.inputs
        wants_logprobs = inputs.sampling is not None and bool(inputs.sampling.wants_logprobs)
        sampled = step.sampled if wants_logprobs else (step.sampled.sampled_token_ids if step.sampled else None)
        sampled, prompt_out = jax.device_get((sampled, step.prompt_out))  # the step's one device-to-host copy
        if inputs.spec is not None:
            return self._verified(inputs, sampled, wants_logprobs, prompt_out)
        tokens = np.zeros(0, np.int32) if sampled is None else \
            np.asarray(sampled.sampled_token_ids if wants_logprobs else sampled)[:len(inputs.sampled)]  # [N]
        self.inputs.record_sampled(inputs, tokens)
        token_ids = tokens.tolist()
        logprobs = {}
        if wants_logprobs:
            for row, cached in enumerate(inputs.sampled):
                if cached.data.needs_sample_logprobs:
                    logprobs[cached.request_id] = _sample_result(sampled, row, token_ids[row], cached.data)
        return StepResults(dict(zip([c.request_id for c in inputs.sampled], token_ids)), logprobs,
                           _prompt_logprobs(inputs, prompt_out))


    def _verified(self, inputs: StepInputs, sampled, wants_logprobs: bool, prompt_out) -> StepResults:
        """A step with proposals: each sampled chunk's rows verified into a run (spec_decode/rejection.py), which
        joins the runner's row; runs of chunks without proposals are their one token."""
        spec = inputs.spec
        rows = np.asarray(sampled.sampled_token_ids if wants_logprobs else sampled)[:spec.num_rows]  # [R]
        runs = [accept_run(proposals, rows[first:first + len(proposals) + 1])
                for first, proposals in zip(spec.first_rows.tolist(), spec.proposals)]
        self.inputs.record_runs(inputs, runs)
        results = StepResults({}, {}, _prompt_logprobs(inputs, prompt_out))
        for cached, first, proposals, run in zip(inputs.sampled, spec.first_rows.tolist(), spec.proposals, runs):
            request_id, run = cached.request_id, run.tolist()
            needs_logprobs = wants_logprobs and cached.data.needs_sample_logprobs
            if len(proposals):
                results.spec_tokens[request_id] = run
                if needs_logprobs:
                    results.spec_logprobs[request_id] = [_sample_result(sampled, first + j, token, cached.data)
                                                         for j, token in enumerate(run)]
            else:
                results.tokens[request_id] = run[0]
                if needs_logprobs:
                    results.logprobs[request_id] = _sample_result(sampled, first, run[0], cached.data)
        return results


def _abstract_placed(tree):
    """Shapes, dtypes and placements of device arrays (None stays None)."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)


def _sample_result(sampled, row: int, token: int, request: NewRequestData) -> SampleResult:
    """The row's token with its logprob and rank, and its top-N when the request asked."""
    params = request.sampling_params
    num_logprobs = len(params.logprob_token_ids) if params.logprob_token_ids else params.logprobs or 0
    top = [(int(t), float(lp)) for t, lp in zip(sampled.top_logprob_token_ids[row][:num_logprobs],
                                                  sampled.top_logprobs[row][:num_logprobs])]
    return SampleResult(token, float(sampled.sampled_logprobs[row]), int(sampled.sampled_ranks[row]), top)


def _prompt_logprobs(inputs: StepInputs, prompt_out: list[tuple]) -> dict[str, PromptLogprobs]:
    if not prompt_out:
        return {}
    target, rank, top_ids, top_lp = (np.concatenate(parts) for parts in zip(*prompt_out))
    result: dict[str, PromptLogprobs] = {}
    for span in inputs.prompt_spans:
        request = span.cached.data
        n = request.sampling_params.prompt_logprobs
        entries = []
        for j, position in enumerate(span.positions, start=span.first_row):
            entry = {int(t): Logprob(float(lp), rank=k + 1) for k, (t, lp) in enumerate(zip(top_ids[j][:n],
                                                                                          top_lp[j][:n]))}
            entry.setdefault(request.prompt_token_ids[position + 1], Logprob(float(target[j]), rank=int(rank[j])))
            entries.append(entry)
        result[request.request_id] = entries
    return result
