"""The program set: its size at the default engine arguments, and every step a scheduler can produce runs on
one of its programs with exactly the shapes that program was compiled for (property test over random schedules,
with steps scheduled ahead of their predecessor's results, preemption, prompt logprobs and penalties)."""

from __future__ import annotations

import random

import jax
import numpy as np
import pytest

from jaxllm.config import ModelConfig, SchedulerConfig
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.bucketing import PROMPT_ROWS, Buckets, ProgramKey
from jaxllm.engine.input_batch import InputBatch
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.request import Request
from jaxllm.engine.scheduler import Scheduler
from jaxllm.model.kernels import REFERENCE
from jaxllm.engine.step_programs import WRITE_LOGIT_ROWS_KEY, StepPrograms, abstract_sampling_batch
from jaxllm.sampling_params import SamplingParams

PROGRAM_BUDGET = 64  # at the default engine arguments (README)


@pytest.mark.parametrize("pallas", [False, True], ids=["reference", "pallas"])
def test_program_set_at_the_defaults_is_within_budget(pallas):
    args = EngineArgs()
    buckets = Buckets(args.max_num_batched_tokens, args.max_num_seqs, decode_only_programs=pallas)
    programs = list(buckets.all_programs())
    assert len(programs) == len(set(programs))
    forward = [p for p in programs if p.kind == "forward"]
    assert len(forward) == (16 if pallas else 10)  # T = 1 .. 512 (+ decode-only T = 1 .. 64 on the Pallas path)
    assert sum(p.kind == "sample" for p in programs) == 6  # S = 2 .. 64
    # + prompt logprobs and the logit-state write: one each
    assert len(programs) == (24 if pallas else 18) <= PROGRAM_BUDGET


def test_keys_round_up_and_refuse_what_cannot_happen():
    buckets = Buckets(max_num_batched_tokens=48, max_num_seqs=6)
    assert buckets.forward_key(33, decode_only=False) == ProgramKey("forward", 64)
    assert buckets.forward_key(5, decode_only=True) == ProgramKey("forward", 8)  # no decode-only programs here
    assert Buckets(48, 6, decode_only_programs=True).forward_key(5, True) == ProgramKey("forward", 8, True)
    assert buckets.sample_key(6) == ProgramKey("sample", 8)
    assert buckets.num_seq_rows(64) == 6 and buckets.num_seq_rows(4) == 4
    assert buckets.num_logits_rows == 8 + PROMPT_ROWS
    with pytest.raises(ValueError, match="exceeds max_num_batched_tokens 48"):
        buckets.forward_key(49, decode_only=False)


@pytest.mark.parametrize("pallas", [False, True], ids=["reference", "pallas"])
def test_every_scheduled_step_matches_a_program_of_the_set(pallas):
    rng = random.Random(int(pallas))
    vocab, block_size, max_model_len = 64, 4, 48
    config = ModelConfig("llama", vocab, 16, 32, 1, 2, 1, 8, max_position_embeddings=max_model_len)
    sched_config = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=max_model_len)
    scheduler = Scheduler(sched_config, KVCacheManager(BlockPool(40), block_size))
    buckets = Buckets(24, 6, decode_only_programs=pallas)
    inputs = InputBatch(buckets, block_size, max_model_len, vocab, base_seed=0, eos_token_ids=(3,))
    programs = StepPrograms(config, REFERENCE, buckets, inputs.max_blocks)
    program_set = set(buckets.all_programs())
    in_flight, seen, counter, met = [], set(), 0, dict(pending=0, preempted=0, prompt_rows=0, adjusted=0)
    for step in range(1500):
        if rng.random() < 0.35:
            scheduler.add_request(_random_request(rng, f"r{counter}", vocab, max_model_len))
            counter += 1
        if scheduler.requests and rng.random() < 0.03:
            scheduler.abort(rng.choice(list(scheduler.requests)))
        out = scheduler.schedule()
        if out.chunks:
            step_inputs = inputs.prepare(out)
            _check_shapes(step_inputs, programs, program_set)
            _check_mirror(inputs, scheduler, {c.request_id for c in out.chunks if c.samples})
            seen |= {step_inputs.forward_key, step_inputs.sample_key}
            met["pending"] += bool((step_inputs.prev_rows >= 0).any())
            met["preempted"] += bool(out.preempted_request_ids)
            met["prompt_rows"] += bool(step_inputs.prompt_spans)
            met["adjusted"] += bool(step_inputs.sampling is not None and step_inputs.sampling.has_adjustments)
            inputs.commit(step_inputs)
            in_flight.append((out, step_inputs))
        else:
            inputs.forget(out.finished_request_ids)  # as the engine does
        ahead = len(in_flight) == 2 or (in_flight and rng.random() < 0.5)  # sometimes wait, sometimes go ahead
        if in_flight and (ahead or not out.chunks):
            done, done_inputs = in_flight.pop(0)
            tokens = {c.request_id: rng.randint(0, vocab - 1) for c in done.chunks if c.samples}
            inputs.record_sampled(done_inputs, np.array([tokens[c.request_id] for c in done_inputs.sampled], np.int32))
            scheduler.update(done, tokens)
    assert seen - {None} == {p for p in program_set if p.kind in ("forward", "sample")}  # the walk met them all
    assert all(count > 10 for count in met.values()), met


def _check_mirror(inputs: InputBatch, scheduler: Scheduler, sampled_now: set[str]) -> None:
    """The runner's copies, built from plain scheduler outputs only, equal the scheduler's requests: the same
    requests (the running ones), tokens, block tables, sampling parameters and dispatched-token counts."""
    assert set(inputs.requests) == {r.request_id for r in scheduler.running}
    tables = scheduler.kv_cache.block_tables()
    for request in scheduler.running:
        cached = inputs.requests[request.request_id]
        assert cached.tokens[:cached.num_tokens].tolist() == request.all_token_ids
        assert cached.block_table[:cached.num_blocks].tolist() == [b.block_id for b in tables[request.request_id]]
        assert cached.data.sampling_params is request.sampling_params
        # tokens sampled by steps dispatched before: known or pending (this step's sample counts at commit)
        dispatched = len(request.output_token_ids) + request.num_pending - (request.request_id in sampled_now)
        assert cached.num_output == dispatched
    slots = [c.slot for c in inputs.requests.values() if c.slot is not None]
    assert len(slots) == len(set(slots))  # no LogitState slot shared


def _random_request(rng, request_id, vocab, max_model_len) -> Request:
    prompt = [rng.randint(4, vocab - 1) for _ in range(rng.randint(1, max_model_len - 2))]
    extra = rng.choice([{}, {}, dict(prompt_logprobs=1), dict(repetition_penalty=1.2), dict(logit_bias={5: 1.0}),
                        dict(min_tokens=1)])
    params = SamplingParams(temperature=rng.choice([0.0, 1.0]), max_tokens=rng.randint(1, max_model_len - len(prompt)),
                            **extra)
    return Request(request_id, prompt, params, eos_token_ids=(3,))


def _check_shapes(step_inputs, programs: StepPrograms, program_set) -> None:
    forward = step_inputs.forward_key
    assert forward in program_set
    _same_shapes(step_inputs.batch, programs.abstract_step_batch(forward.size, forward.decode_only))
    assert step_inputs.prev_rows.shape == (forward.size,) and step_inputs.prev_rows.dtype == np.int32
    if step_inputs.sample_key is not None:
        assert step_inputs.sample_key in program_set
        key, sampling = step_inputs.sample_key, step_inputs.sampling
        assert sampling.state is None  # the runner's LogitState goes with it
        _same_shapes(sampling, abstract_sampling_batch(key.size, programs.config.vocab_size).replace(
            token_bitmask=None))  # the runner adds the bitmask
    for slot, rows in step_inputs.logit_writes:
        assert 0 <= slot < programs.buckets.max_num_seqs
        _same_shapes(rows, programs.example_args(WRITE_LOGIT_ROWS_KEY, None, None)[2])
    assert len(step_inputs.prompt_targets) % PROMPT_ROWS == 0
    assert len(step_inputs.prompt_targets) <= programs.buckets.num_logits_rows - programs.buckets.num_sample_rows


def _same_shapes(actual, expected) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert (np.shape(a), np.asarray(a).dtype) == (e.shape, e.dtype)
