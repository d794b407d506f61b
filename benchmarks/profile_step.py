"""Where an engine step's time goes: scheduling, host batch packing, device step, output processing.

    python benchmarks/profile_step.py --workload fixed      # the compare_hf.py workloads, after a warm-up run
    python benchmarks/profile_step.py --workload mixed --trace-dir /tmp/jaxllm-trace   # + a jax.profiler trace

Wraps the engine's own functions with wall-clock timers (no engine change): `scheduler.schedule` and
`scheduler.update` (scheduling), `build_step_batch` + `build_sampling_batch` (host packing), the jitted step up
to `block_until_ready` (host-to-device copy, forward, sampling; the step is one XLA program), `jax.device_get`
(device-to-host) and `processor.record_sample` + `processor.outputs_for` (detokenize, stop checks, outputs).
The rest of `LLMEngine.step` is reported as "other host". Device step time is also split between decode-only
steps and steps that carry prefill chunks (bucketed shape from the runner's `Buckets.shape_for`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import time

import jax
from compare_hf import generate_greedy, make_workload

from jaxllm.engine import runner as runner_module
from jaxllm.llm import LLM


class StageTimer:
    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)
        self.enabled = False
        self.step_kind = "decode-only"  # of the step being executed, set from its bucketed shape

    def wrap(self, stage: str, fn, block: bool = False):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.enabled:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            if block:
                jax.block_until_ready(result)
            elapsed = time.perf_counter() - start
            self.seconds[stage] += elapsed
            self.calls[stage] += 1
            if block:
                self.seconds[f"{stage}, {self.step_kind} steps"] += elapsed
                self.calls[f"{stage}, {self.step_kind} steps"] += 1
            return result
        return timed


def instrument(llm: LLM, timer: StageTimer) -> None:
    engine, runner = llm.engine, llm.engine.runner
    engine.step = timer.wrap("engine step (total)", engine.step)
    engine.scheduler.schedule = timer.wrap("scheduling", engine.scheduler.schedule)
    engine.scheduler.update = timer.wrap("scheduling", engine.scheduler.update)
    runner_module.build_step_batch = timer.wrap("host batch packing", runner_module.build_step_batch)
    runner_module.build_sampling_batch = timer.wrap("host batch packing", runner_module.build_sampling_batch)
    shape_for = runner.buckets.shape_for

    def shape_for_and_kind(query_lens, blocks_per_seq):
        shape = shape_for(query_lens, blocks_per_seq)
        timer.step_kind = "prefill-carrying" if shape.num_prefill_rows else "decode-only"
        return shape

    runner.buckets = _BucketsSpy(runner.buckets, shape_for_and_kind)
    step = runner._step
    runner._step = timer.wrap("device step (h2d + forward + sample)", step, block=True)
    runner._step._cache_size = step._cache_size  # the runner counts compiled programs through it
    runner_module.jax = _JaxWithTimedDeviceGet(timer)
    engine.processor.record_sample = timer.wrap("output processing", engine.processor.record_sample)
    engine.processor.outputs_for = timer.wrap("output processing", engine.processor.outputs_for)


class _BucketsSpy:
    """The runner's Buckets with shape_for replaced (Buckets is a frozen dataclass)."""

    def __init__(self, buckets, shape_for):
        self._buckets, self.shape_for = buckets, shape_for

    def __getattr__(self, name):
        return getattr(self._buckets, name)


class _JaxWithTimedDeviceGet:
    """The runner module's `jax`, with device_get timed (the step's one device-to-host copy)."""

    def __init__(self, timer: StageTimer):
        self._device_get = timer.wrap("device-to-host copy", jax.device_get)

    def __getattr__(self, name):
        return self._device_get if name == "device_get" else getattr(jax, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["fixed", "mixed"], default="fixed")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--trace-dir", default=None, help="also write a jax.profiler trace of the measured run")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()

    llm = LLM(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=1024)
    timer = StageTimer()
    instrument(llm, timer)

    generate_greedy(llm, make_workload(args.workload, llm.get_tokenizer(), seed=1))  # compiles the step shapes
    timer.enabled = True
    trace = jax.profiler.trace(args.trace_dir) if args.trace_dir else contextlib.nullcontext()
    with trace:
        elapsed, tokens = generate_greedy(llm, make_workload(args.workload, llm.get_tokenizer()))
    steps = timer.calls["engine step (total)"]
    total = timer.seconds["engine step (total)"]
    by_kind = {k: v for k, v in timer.seconds.items() if k.endswith(" steps")}
    stages = {k: v for k, v in timer.seconds.items() if k != "engine step (total)" and k not in by_kind}
    stages["other host"] = total - sum(stages.values())
    print(f"workload {args.workload}: {tokens} output tokens in {elapsed:.1f} s ({tokens / elapsed:.1f} tok/s), "
          f"{steps} engine steps, {total / steps * 1e3:.1f} ms per step; outside engine steps: "
          f"{elapsed - total:.2f} s\n")
    print("| stage | ms per step | share of step time |\n|---|---:|---:|")
    for stage, seconds in stages.items():
        print(f"| {stage} | {seconds / steps * 1e3:.2f} | {seconds / total:.1%} |")
    print("\n| device step, by step kind | steps | ms per step | share of step time |\n|---|---:|---:|---:|")
    for kind, seconds in sorted(by_kind.items()):
        print(f"| {kind} | {timer.calls[kind]} | {seconds / timer.calls[kind] * 1e3:.1f} | {seconds / total:.1%} |")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"workload": args.workload, "elapsed_s": elapsed, "output_tokens": tokens, "steps": steps,
                       "step_seconds": total, "stage_seconds": stages,
                       "device_seconds_by_step_kind": by_kind}, f, indent=1)


if __name__ == "__main__":
    main()
