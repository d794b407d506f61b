"""Host work per engine step at a large batch with long contexts: scheduling, array packing, output processing.

    python benchmarks/host_overhead.py [--batch 256] [--context 2000] [--steps 20] [--penalties] [--vocab-size N]

A tiny random-weight model (the "tiny" preset, context raised) keeps the device's share of a step small, so the
step's wall time is mostly host work. Per measured decode step (every sequence decoding, contexts ~--context):

    wall ms     engine.step()
    blocked ms  inside jax.device_get in the runner: waiting for the device, then the device-to-host copy
    host ms     wall - blocked: host work on the step's critical path
    cpu ms      CPU time of the engine's thread outside jax.device_get: the host work itself, which other
                processes and the device's own threads (the CPU backend) cannot stretch as they stretch `host ms`

With async scheduling the host work of step t + 1 runs while the device computes step t, so less of it shows.
Runs against whatever jaxllm is importable (PYTHONPATH), so an older checkout can be measured the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import statistics
import time

import jax
import numpy as np

from jaxllm.benchmarks.model_presets import model_preset
from jaxllm.engine import runner as runner_module
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.loaders import LoadedModel
from jaxllm.model import random_params
from jaxllm.sampling_params import SamplingParams


class BlockedTimer:
    """The runner module's `jax`, with device_get timed."""

    def __init__(self):
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # this thread's CPU time inside device_get

    def device_get(self, tree):
        start, cpu_start = time.perf_counter(), time.thread_time()
        result = jax.device_get(tree)
        self.seconds += time.perf_counter() - start
        self.cpu_seconds += time.thread_time() - cpu_start
        return result

    def __getattr__(self, name):
        return getattr(jax, name)


def max_tokens(args) -> int:
    """Enough that no request finishes before the last prompt is prefilled and the measured steps are done."""
    return args.batch * args.context // args.prefill_tokens + args.steps + 16


def build_engine(args) -> LLMEngine:
    config = dataclasses.replace(model_preset("tiny"), max_position_embeddings=args.context + max_tokens(args) + 16,
                                 vocab_size=args.vocab_size)
    loaded = LoadedModel(config, random_params(config, jax.random.key(0)), source=None)
    engine_args = dict(skip_tokenizer=True, max_num_seqs=args.batch, max_num_batched_tokens=args.prefill_tokens,
                       max_model_len=config.max_position_embeddings)
    if "async_scheduling" in inspect.signature(EngineArgs).parameters:  # older checkouts have no such field
        engine_args["async_scheduling"] = args.async_scheduling
    return LLMEngine(EngineArgs(**engine_args), loaded=loaded)


def measure(args) -> dict:
    engine = build_engine(args)
    timer = BlockedTimer()
    runner_module.jax = timer
    rng = np.random.default_rng(0)
    extra = dict(repetition_penalty=1.1, frequency_penalty=0.1) if args.penalties else {}
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens(args), ignore_eos=True, detokenize=False, **extra)
    for i in range(args.batch):
        engine.add_request(str(i), rng.integers(0, min(1000, args.vocab_size), size=args.context).tolist(), params)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.requests.values()) \
            or engine.scheduler.waiting:
        engine.step()  # prefill every prompt (and compile what decoding needs)
    for _ in range(3):
        engine.step()
    walls, blocked, cpus = [], [], []
    for _ in range(args.steps):
        timer.seconds = timer.cpu_seconds = 0.0
        start, cpu_start = time.perf_counter(), time.thread_time()
        engine.step()
        walls.append(time.perf_counter() - start)
        cpus.append(time.thread_time() - cpu_start - timer.cpu_seconds)
        blocked.append(timer.seconds)
    hosts = [w - b for w, b in zip(walls, blocked)]
    return {"wall_ms": statistics.median(walls) * 1e3, "blocked_ms": statistics.median(blocked) * 1e3,
            "host_ms": statistics.median(hosts) * 1e3, "cpu_ms": statistics.median(cpus) * 1e3,
            "sequences": len(engine.scheduler.running)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prefill-tokens", type=int, default=4096, help="max_num_batched_tokens")
    parser.add_argument("--penalties", action="store_true", help="every request uses repetition/frequency penalties")
    parser.add_argument("--vocab-size", type=int, default=1024, help="of the tiny model (the default model: 49152)")
    parser.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    result = measure(args)
    print(f"batch {result['sequences']}, contexts ~{args.context}: wall {result['wall_ms']:.1f} ms, blocked "
          f"{result['blocked_ms']:.1f} ms, host {result['host_ms']:.1f} ms (cpu {result['cpu_ms']:.1f} ms) per decode "
          f"step (median of {args.steps})")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"args": vars(args), **result}, f, indent=1)


if __name__ == "__main__":
    main()
