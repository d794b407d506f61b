"""Core model figures on this machine: load time, param memory, compile time and forward step time, f32 vs bf16.

    python benchmarks/core_forward.py [--model PATH] [--batch-sizes 1 8 32] [--context 64] [--repeats 10]

Both dtypes run in the same process, one after the other, so their ratio is a side-by-side measurement.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax

from jaxllm.loaders import load_model
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward
from jaxllm.model.params import param_bytes

BLOCK_SIZE = 16


def decode_batch(batch_size: int, context: int, blocks_per_seq: int):
    """One decode token per sequence, each with `context` tokens already cached."""
    chunks = [SequenceChunk([7], context, list(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)))
              for i in range(batch_size)]
    return build_step_batch(chunks, BLOCK_SIZE)


def prefill_batch(num_tokens: int, blocks_per_seq: int):
    return build_step_batch([SequenceChunk(list(range(1, num_tokens + 1)), 0, list(range(1, 1 + blocks_per_seq)))],
                            BLOCK_SIZE)


def time_step(forward, params, kv, batch, repeats: int):
    """(compile seconds, median step seconds, spread) for one step shape; the cache is donated each call."""
    start = time.perf_counter()
    logits, kv = forward(params, kv, batch)
    logits.block_until_ready()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        logits, kv = forward(params, kv, batch)
        logits.block_until_ready()
        times.append(time.perf_counter() - start)
    return compile_s, statistics.median(times), (min(times), max(times)), kv


def measure(model, dtype: str, batch_sizes, context: int, prefill: int, repeats: int) -> dict:
    start = time.perf_counter()
    loaded = load_model(model, dtype=dtype)
    jax.block_until_ready(loaded.params)
    result = {"dtype": dtype, "load_s": time.perf_counter() - start, "param_bytes": param_bytes(loaded.params)}
    blocks_per_seq = -(-max(context + 1, prefill) // BLOCK_SIZE)
    kv = init_kv_cache(loaded.config, 1 + max(batch_sizes) * blocks_per_seq, BLOCK_SIZE,
                       loaded.params.embed.dtype)
    forward = jit_forward(loaded.config)
    steps = [(f"prefill {prefill} tokens", prefill_batch(prefill, blocks_per_seq), prefill)]
    steps += [(f"decode batch {b}", decode_batch(b, context, blocks_per_seq), b) for b in batch_sizes]
    result["steps"] = []
    for name, batch, tokens in steps:
        compile_s, median, spread, kv = time_step(forward, loaded.params, kv, batch, repeats)
        result["steps"].append({"step": name, "compile_s": compile_s, "median_ms": median * 1e3,
                                "min_ms": spread[0] * 1e3, "max_ms": spread[1] * 1e3,
                                "tokens_per_s": tokens / median})
        print(f"{dtype:9s} {name:22s} compile {compile_s:6.2f}s  step {median * 1e3:8.2f} ms "
              f"[{spread[0] * 1e3:.2f}-{spread[1] * 1e3:.2f}]  {tokens / median:8.1f} tok/s", flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=64, help="cached tokens per sequence for decode steps")
    parser.add_argument("--prefill", type=int, default=128, help="prompt length of the prefill step")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.default_backend()} ({platform.processor() or platform.machine()}), "
          f"{jax.device_count()} device(s)", flush=True)
    results = [measure(args.model, d, args.batch_sizes, args.context, args.prefill, args.repeats)
               for d in args.dtypes]
    for r in results:
        print(f"{r['dtype']}: load {r['load_s']:.2f}s, params {r['param_bytes'] / 2**20:.1f} MiB")
    if len(results) == 2:
        for a, b in zip(*(r["steps"] for r in results)):
            print(f"{a['step']:22s} {results[1]['dtype']}/{results[0]['dtype']} step time ratio "
                  f"{b['median_ms'] / a['median_ms']:.2f}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"jax": jax.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
