"""Padded token rows: every step's forward runs on the smallest token bucket that holds it, and on the mixed
workload's shapes (128 requests, prompts and outputs of 16-256 tokens) at the default engine arguments the padded
share of the computed rows stays under a bound (measured 15.5%: benchmarks/padding.py and RESULTS, which also say
why buckets between the powers of two were not kept). Host only: the scheduler and the input batch, no model."""

from __future__ import annotations

import numpy as np

from jaxllm.benchmarks.datasets import mixed_lengths
from jaxllm.config import SchedulerConfig
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.bucketing import Buckets
from jaxllm.engine.input_batch import InputBatch
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.request import Request
from jaxllm.engine.runner import TokenCounts
from jaxllm.engine.scheduler import Scheduler
from jaxllm.sampling_params import SamplingParams

VOCAB, BLOCK, MAX_MODEL_LEN = 1000, 16, 1024


def test_mixed_workload_pads_under_a_sixth_of_its_rows():
    args = EngineArgs()
    buckets = Buckets(args.max_num_batched_tokens, args.max_num_seqs)
    counts, steps = _run_mixed_workload(buckets, args.max_num_seqs, args.max_num_batched_tokens)
    assert counts.scheduled == sum(p + o - 1 for p, o in mixed_lengths(np.random.RandomState(0)))  # every token
    for scheduled, computed in steps:
        smaller = [t for t in buckets.token_sizes if t < computed]
        assert scheduled <= computed and (not smaller or smaller[-1] < scheduled)  # the smallest that holds it
    assert counts.padded_fraction < 0.16, counts


def _run_mixed_workload(buckets: Buckets, max_num_seqs: int, max_num_batched_tokens: int):
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=MAX_MODEL_LEN)
    scheduler = Scheduler(config, KVCacheManager(BlockPool(1 + max_num_seqs * MAX_MODEL_LEN // BLOCK), BLOCK))
    inputs = InputBatch(buckets, BLOCK, MAX_MODEL_LEN, VOCAB, base_seed=0, eos_token_ids=())
    rng = np.random.default_rng(0)
    for i, (prompt_len, output_len) in enumerate(mixed_lengths(np.random.RandomState(0))):
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
        scheduler.add_request(Request(str(i), rng.integers(0, VOCAB, size=prompt_len).tolist(), params))
    counts, steps = TokenCounts(), []
    while scheduler.requests:
        out = scheduler.schedule()
        step = inputs.prepare(out)
        counts.add(out.num_tokens, step.forward_key.size)
        steps.append((out.num_tokens, step.forward_key.size))
        inputs.commit(step)
        tokens = {c.request_id: int(rng.integers(0, VOCAB)) for c in out.chunks if c.samples}
        inputs.record_sampled(step, np.array([tokens[c.request_id] for c in step.sampled], np.int32))
        scheduler.update(out, tokens)
    return counts, steps
