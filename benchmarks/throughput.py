"""Offline throughput, in the spirit of `vllm bench throughput`: all requests queued at once, greedy, EOS ignored.

    python benchmarks/throughput.py --num-prompts 64 --input-len 128 --output-len 128         # the default model
    python benchmarks/throughput.py --model path/to/model --dataset random --random-range-ratio 0.5
    python benchmarks/throughput.py --random-weights --config llama3-8b --dtype bfloat16      # no weights needed

Prompts are random token ids (jaxllm.benchmarks.datasets.random_requests; --seed), so no tokenizer is loaded
and nothing is detokenized. A warm-up run on other prompts of the same lengths comes first, so the timed run
compiles nothing (its compile count is reported, and should be 0) and cannot hit the prefix cache.
Reported: requests/s, total (prompt + output) tokens/s and output tokens/s over the timed run's wall time.
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

from jaxllm.benchmarks.datasets import random_requests
from jaxllm.benchmarks.model_presets import MODEL_PRESETS, model_preset
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.loaders import LoadedModel
from jaxllm.model.params import param_bytes, random_params
from jaxllm.sampling_params import SamplingParams

_compile_events: list[float] = []  # seconds of every XLA backend compile in this process


def _on_event(event: str, secs: float, **_) -> None:
    if "backend_compile" in event:
        _compile_events.append(secs)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model path or id (default: the default model)")
    p.add_argument("--random-weights", action="store_true", help="random params of --config's shapes")
    p.add_argument("--config", choices=sorted(MODEL_PRESETS), help="shape preset for --random-weights")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="auto: the loader's choice; with --random-weights, bfloat16 on GPU and float32 on CPU")
    p.add_argument("--dataset", choices=["fixed", "random"], default="fixed",
                   help="fixed: every request has --input-len/--output-len; random: lengths vary by the ratio")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="--dataset random: lengths uniform in [len * (1 - r), len * (1 + r)]")
    p.add_argument("--seed", type=int, default=0, help="dataset and engine seed")
    p.add_argument("--max-num-seqs", type=int, default=EngineArgs.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=EngineArgs.max_num_batched_tokens)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's context length")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    if args.random_weights != (args.config is not None):
        p.error("--random-weights and --config go together")
    if args.random_weights and args.model is not None:
        p.error("--model and --random-weights exclude each other")
    if args.dataset == "fixed" and args.random_range_ratio != 0.0:
        p.error("--random-range-ratio needs --dataset random")
    return args


def build_engine(args) -> tuple[LLMEngine, float]:
    """(engine, load seconds). Random weights: the preset's config, params drawn on the default device."""
    engine_args = EngineArgs(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                             max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                             seed=args.seed, skip_tokenizer=True)
    start = time.perf_counter()
    loaded = None
    if args.random_weights:
        config = model_preset(args.config)
        dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}.get(
            args.dtype, jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32)
        # eager on purpose: the peak is float32 copies of all params + the cast ones (48 GB for llama3-8b in
        # bfloat16); jitted, XLA:CPU plans 76 GB of temporaries for it
        params = random_params(config, jax.random.key(args.seed), dtype)
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


def benchmark(args) -> dict:
    jax.monitoring.register_event_duration_secs_listener(_on_event)
    try:
        engine, load_s = build_engine(args)
        vocab = engine.model_config.vocab_size
        ratio = args.random_range_ratio if args.dataset == "random" else 0.0
        requests = random_requests(args.num_prompts, args.input_len, args.output_len, ratio, vocab, args.seed)
        loaded_at = len(_compile_events)
        warmup_s, _ = run(engine, same_lengths(requests, vocab, args.seed + 1), "warmup-")
        programs, warmed_at = engine.runner.num_compiled_programs, len(_compile_events)
        elapsed, output_tokens = run(engine, requests, "")
        compiles = list(_compile_events)
    finally:
        jax.monitoring.unregister_event_duration_listener(_on_event)
        _compile_events.clear()
    prompt_tokens = sum(len(p) for p, _ in requests)
    return {
        "num_requests": len(requests), "total_prompt_tokens": prompt_tokens, "total_output_tokens": output_tokens,
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
    }


def environment() -> dict:
    device = jax.devices()[0]
    return {"jax": jax.__version__, "backend": jax.default_backend(), "device": device.device_kind,
            "device_count": jax.device_count(), "platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def main(argv=None) -> dict:
    args = parse_args(argv)
    model = f"random {args.config}" if args.random_weights else (args.model or "default model")
    result = benchmark(args)
    print(f"{model}: {result['num_requests']} requests, {result['total_prompt_tokens']} prompt + "
          f"{result['total_output_tokens']} output tokens in {result['elapsed_time']:.2f} s")
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, {result['tokens_per_second']:.1f} total "
          f"tokens/s, {result['output_tokens_per_second']:.1f} output tokens/s")
    print(f"Load {result['load_seconds']:.2f} s; warm-up run {result['warmup_seconds']:.2f} s with "
          f"{result['step_programs_compiled_in_warmup']} step programs ({result['xla_compiles_in_warmup']} XLA "
          f"compiles, {result['compile_seconds_in_warmup']:.2f} s); timed run: "
          f"{result['xla_compiles_in_timed_run']} XLA compiles ({result['compile_seconds_in_timed_run']:.2f} s)")
    report = {"args": vars(args), "model": model, "environment": environment(), **result}
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
