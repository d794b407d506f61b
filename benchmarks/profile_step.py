"""Where an engine step's time goes: scheduling, host batch packing, dispatch, waiting for the device, outputs.

    python benchmarks/profile_step.py --workload fixed      # the compare_hf.py workloads, after a warm-up run
    python benchmarks/profile_step.py --workload mixed --trace-dir /tmp/jaxllm-trace   # + a jax.profiler trace

Wraps the engine's own functions with wall-clock timers (no engine change): `scheduler.schedule` and
`scheduler.update` (scheduling), `InputBatch.prepare` + `commit` (host packing), the program calls (dispatch:
host-to-device copies and enqueueing; they return before the device finishes), `runner.fetch` (waiting for the
device, then the device-to-host copy) and `processor.record_sample` + `processor.outputs_for` (detokenize, stop
checks, outputs). The rest of `LLMEngine.step` is reported as "other host". With async scheduling (`--async`,
the engine's default) the wait in fetch is what is left of a step's device time after the host work of the next
step overlapped it. Waiting time is also split between decode-only steps and steps that carry prefill chunks.
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

from jaxllm.llm import LLM


class StageTimer:
    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)
        self.enabled = False
        self.kinds = {}  # id of an in-flight step -> "decode-only" | "prefill-carrying"

    def wrap(self, stage: str, fn, kind_of=None):
        """fn timed under `stage`; with kind_of(args), also under "stage, <kind> steps"."""
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.enabled:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            elapsed = time.perf_counter() - start
            self.seconds[stage] += elapsed
            self.calls[stage] += 1
            if kind_of is not None:
                kind = f"{stage}, {kind_of(*args)} steps"
                self.seconds[kind] += elapsed
                self.calls[kind] += 1
            return result
        return timed


def instrument(llm: LLM, timer: StageTimer) -> None:
    engine, runner = llm.engine, llm.engine.runner
    engine.step = timer.wrap("engine step (total)", engine.step)
    engine.scheduler.schedule = timer.wrap("scheduling", engine.scheduler.schedule)
    engine.scheduler.update = timer.wrap("scheduling", engine.scheduler.update)
    runner.inputs.prepare = timer.wrap("host batch packing", runner.inputs.prepare)
    runner.inputs.commit = timer.wrap("host batch packing", runner.inputs.commit)
    runner.programs = _TimedPrograms(runner.programs, timer.wrap("dispatch (h2d copies, enqueue)", runner.programs))
    dispatch = runner.dispatch

    def dispatch_and_note_kind(out, **kwargs):
        step = dispatch(out, **kwargs)
        timer.kinds[id(step)] = "prefill-carrying" if any(c.num_new_tokens > 1 for c in out.chunks) else "decode-only"
        return step

    runner.dispatch = dispatch_and_note_kind
    runner.fetch = timer.wrap("fetch (wait for the device, d2h copy)", runner.fetch,
                              kind_of=lambda step: timer.kinds.pop(id(step), "unknown"))
    engine.processor.record_sample = timer.wrap("output processing", engine.processor.record_sample)
    engine.processor.outputs_for = timer.wrap("output processing", engine.processor.outputs_for)


class _TimedPrograms:
    """The runner's StepPrograms with its calls timed (attributes pass through)."""

    def __init__(self, programs, timed_call):
        self._programs, self._call = programs, timed_call

    def __call__(self, *args):
        return self._call(*args)

    def __getattr__(self, name):
        return getattr(self._programs, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["fixed", "mixed"], default="fixed")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--trace-dir", default=None, help="also write a jax.profiler trace of the measured run")
    parser.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false",
                        help="wait for each step before scheduling the next")
    parser.add_argument("--dtype", default="auto", help="weights and KV pool (EngineArgs.dtype)")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()

    llm = LLM(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=1024,
              async_scheduling=args.async_scheduling, dtype=args.dtype)
    timer = StageTimer()
    instrument(llm, timer)

    generate_greedy(llm, make_workload(args.workload, llm.get_tokenizer(), seed=1))  # builds the programs it needs
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
    print("\n| waiting for the device, by step kind | steps | ms per step | share of step time |\n|---|---:|---:|---:|")
    for kind, seconds in sorted(by_kind.items()):
        print(f"| {kind} | {timer.calls[kind]} | {seconds / timer.calls[kind] * 1e3:.1f} | {seconds / total:.1%} |")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"workload": args.workload, "elapsed_s": elapsed, "output_tokens": tokens, "steps": steps,
                       "step_seconds": total, "stage_seconds": stages,
                       "device_seconds_by_step_kind": by_kind}, f, indent=1)


if __name__ == "__main__":
    main()
