"""Offline throughput, as `vllm bench throughput`: all requests queued at once, greedy, EOS ignored.

    jaxllm bench throughput --num-prompts 64 --input-len 128 --output-len 128          # the default model
    jaxllm bench throughput --model path/to/model --dataset-name random --random-range-ratio 0.5
    jaxllm bench throughput --random-weights --config llama3-8b --dtype bfloat16       # no weights needed

(`python benchmarks/throughput.py` takes the same flags.) Prompts are random token ids (datasets.random_requests,
seeded by --seed, which also seeds the engine), so no tokenizer is loaded and nothing is detokenized. A warm-up
run on other prompts of the same lengths comes first, so the timed run compiles nothing (its compile count is
reported, and should be 0) and cannot hit the prefix cache. Reported: vLLM's line, `Throughput: X requests/s,
Y total tokens/s, Z output tokens/s` (total: prompt + output), over the timed run's wall time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.benchmarks.datasets import dataset_name_arg, random_requests
from jaxllm.benchmarks.model_presets import MODEL_PRESETS, model_preset
from jaxllm.compile_counter import CompileCounter
from jaxllm.engine.arg_utils import add_engine_args
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.loaders import LoadedModel
from jaxllm.loaders.cpu_dtype import cpu_auto_dtype
from jaxllm.model.kernels import on_gpu
from jaxllm.model.params import param_bytes, random_params
from jaxllm.sampling_params import SamplingParams

DATASETS = ("random",)
def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The benchmark's flags (vLLM's names), then every EngineArgs field (--model, --seed, --dtype, ...)."""
    parser.add_argument("--dataset-name", type=dataset_name_arg(DATASETS), default="random",
                        metavar="{random}", help="random (the only one): prompts of random token ids")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=128,
                        help="prompt tokens per request")
    parser.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=128,
                        help="output tokens per request (EOS is ignored)")
    parser.add_argument("--random-range-ratio", type=float, default=0.0,
                        help="lengths uniform in [len * (1 - r), len * (1 + r)]; 0: every request the same")
    parser.add_argument("--random-weights", action="store_true", help="random params of --config's shapes")
    parser.add_argument("--config", choices=sorted(MODEL_PRESETS), help="shape preset for --random-weights")
    parser.add_argument("--output-json", default=None, metavar="PATH",
                        help="write the arguments, the environment and the results to this file")
    add_engine_args(parser)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """The flags that go together or exclude each other (ValueError naming them)."""
    if args.random_weights != (args.config is not None):
        raise ValueError("--random-weights and --config go together")
    if args.random_weights and args.model is not None:
        raise ValueError("--model and --random-weights exclude each other")


def build_engine(args: argparse.Namespace) -> tuple[LLMEngine, float]:
    """(engine, load seconds). Random weights: the preset's config, params drawn on the default device."""
    engine_args = EngineArgs.from_cli_args(args)
    start = time.perf_counter()
    loaded = None
    if args.random_weights:
        config = model_preset(args.config)
        dtype = engine_args.dtype if engine_args.dtype != "auto" else "bfloat16" if on_gpu() else cpu_auto_dtype()
        # eager on purpose: the peak is float32 copies of all params + the cast ones (48 GB for llama3-8b in
        # bfloat16); jitted, XLA:CPU plans 76 GB of temporaries for it
        params = random_params(config, jax.random.key(args.seed), jnp.dtype(dtype))
        loaded = LoadedModel(config, jax.block_until_ready(params), source=None)  # no files behind it
    engine = LLMEngine(engine_args, loaded=loaded)
    jax.block_until_ready(engine.loaded.params)
    return engine, time.perf_counter() - start


def run(engine: LLMEngine, requests, tag: str) -> tuple[float, int]:
    """Queue every request, step until all finish: (wall seconds, output tokens)."""
    start = time.perf_counter()
    for i, (prompt, output_len) in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
        engine.add_request(f"{tag}{i}", {"prompt_token_ids": prompt}, params, output_kind="final")
    output_tokens = 0
    while engine.has_unfinished_requests():
        output_tokens += sum(len(o.token_ids) for out in engine.step() if out.finished for o in out.outputs)
    return time.perf_counter() - start, output_tokens


def same_lengths(requests, vocab_size: int, seed: int) -> list[tuple[list[int], int]]:
    """Requests of the same lengths (so the same step shapes) and other token ids (so no prefix-cache hits)."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab_size, size=len(p)).tolist(), n) for p, n in requests]


def benchmark(args: argparse.Namespace) -> tuple[dict, LLMEngine]:
    """Load, warm up, time: (the results, vLLM's keys among them; the engine)."""
    with CompileCounter() as counter:  # every program XLA builds in this process meanwhile
        engine, load_s = build_engine(args)
        vocab = engine.model_config.vocab_size
        requests = random_requests(args.num_prompts, args.input_len, args.output_len, args.random_range_ratio,
                                   vocab, args.seed)
        loaded_at = counter.count
        warmup_s, _ = run(engine, same_lengths(requests, vocab, args.seed + 1), "warmup-")
        programs, warmed_at = engine.runner.num_compiled_programs, counter.count
        elapsed, output_tokens = run(engine, requests, "")
    compiles = [seconds for _, seconds in counter.events]
    prompt_tokens = sum(len(p) for p, _ in requests)
    return {
        "num_requests": len(requests), "total_prompt_tokens": prompt_tokens, "total_output_tokens": output_tokens,
        "total_num_tokens": prompt_tokens + output_tokens,
        "elapsed_time": elapsed, "requests_per_second": len(requests) / elapsed,
        "tokens_per_second": (prompt_tokens + output_tokens) / elapsed,
        "output_tokens_per_second": output_tokens / elapsed,
        "load_seconds": load_s, "param_bytes": param_bytes(engine.loaded.params),
        "warmup_seconds": warmup_s, "step_programs_compiled_in_warmup": programs,
        "xla_compiles_in_warmup": warmed_at - loaded_at,
        "compile_seconds_in_warmup": sum(compiles[loaded_at:warmed_at]),
        "step_programs_compiled_in_timed_run": engine.runner.num_compiled_programs - programs,
        "xla_compiles_in_timed_run": len(compiles) - warmed_at,
        "compile_seconds_in_timed_run": sum(compiles[warmed_at:]),
        "step_programs_used": len(engine.runner.programs_used), "engine_steps": engine.num_steps,
        "num_kv_blocks": engine.cache_config.num_blocks,
    }, engine


def environment() -> dict:
    device = jax.devices()[0]
    return {"jax": jax.__version__, "backend": device.platform, "device": device.device_kind,
            "device_count": jax.device_count(), "platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def format_summary(report: dict) -> str:
    """vLLM's three lines (Throughput, prompt and output token totals), then the model, load and compile times."""
    r = report
    return "\n".join([
        f"Throughput: {r['requests_per_second']:.2f} requests/s, {r['tokens_per_second']:.2f} total tokens/s, "
        f"{r['output_tokens_per_second']:.2f} output tokens/s",
        f"Total num prompt tokens:  {r['total_prompt_tokens']}",
        f"Total num output tokens:  {r['total_output_tokens']}",
        f"{r['model']}: {r['num_requests']} requests in {r['elapsed_time']:.2f} s; load {r['load_seconds']:.2f} s; "
        f"warm-up run {r['warmup_seconds']:.2f} s with {r['step_programs_compiled_in_warmup']} step programs "
        f"({r['xla_compiles_in_warmup']} XLA compiles, {r['compile_seconds_in_warmup']:.2f} s); timed run: "
        f"{r['xla_compiles_in_timed_run']} XLA compiles ({r['compile_seconds_in_timed_run']:.2f} s)"])


def run_benchmark(args: argparse.Namespace) -> dict:
    """Run the benchmark the parsed flags describe; print the summary, write --output-json; return the report
    (on a process other than the first of several that run the model together: the report, nothing printed)."""
    check_args(args)
    args = argparse.Namespace(**{**vars(args), "skip_tokenizer": True})  # prompts are token ids: no tokenizer
    model = f"random {args.config}" if args.random_weights else (args.model or "default model")
    result, engine = benchmark(args)
    report = {"args": vars(args), "model": model, "environment": environment(), **result}
    if engine.process_index == 0:
        print(format_summary(report), flush=True)
        if args.output_json:
            with open(args.output_json, "w") as f:
                json.dump(report, f, indent=1)
    return report


def run_cli(args: argparse.Namespace) -> int:
    """`jaxllm bench throughput`: 0 once the summary is printed (bad arguments raise ValueError)."""
    run_benchmark(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    """benchmarks/throughput.py: the same flags as `jaxllm bench throughput`."""
    parser = add_cli_args(argparse.ArgumentParser(prog="throughput.py", description=__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        parser.error(str(e))
    return run_cli(args)


if __name__ == "__main__":
    sys.exit(main())
