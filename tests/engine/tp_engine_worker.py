"""Run in a subprocess with 4 fake CPU devices: the engine with tensor_parallel_size N against the unsharded engine,
greedy, on a workload with chunked prefill, prefix-cache hits and preemption. Prints one JSON object:
{"MODEL/tpN": {"equal": bool, "preempted": int, "prefix_hits": int}} plus {"refused": {...: message}}.

    python -m tests.engine.tp_engine_worker MODEL_DIR=1,2,4 [MODEL_DIR=N,... ...] [--default-model]
        [--refused MODEL_DIR=N ...]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from jaxllm.engine.args import EngineArgs  # noqa: E402
from jaxllm.engine.engine import LLMEngine  # noqa: E402
from jaxllm.sampling_params import SamplingParams  # noqa: E402

TINY = dict(skip_tokenizer=True, max_model_len=128, block_size=4, max_num_seqs=2, max_num_batched_tokens=8,
            num_gpu_blocks=20)  # few programs to compile; two long sequences do not fit the pool together
SHARED = list(range(100, 120))  # a prefix several prompts share (prefix-cache hits)


def workload() -> list[list[int]]:
    return [SHARED + list(range(5 + i, 10 + 3 * i)) if i % 2 else list(range(5 + i, 30 + 2 * i)) for i in range(6)]


def run(model: str | None, tp_size: int | None, engine_args: dict, prompts: list[list[int]], max_tokens: int):
    engine = LLMEngine(EngineArgs(model=model, tensor_parallel_size=tp_size, **engine_args))
    preempted = []
    original = engine.scheduler._preempt
    engine.scheduler._preempt = lambda victim, chunks: (preempted.append(victim), original(victim, chunks))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                                          detokenize=False))
    tokens = {}
    while engine.has_unfinished_requests():
        tokens.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    return tokens, len(preempted), engine.stats()["prefix_cache_hits"]


def compare(name: str, model: str | None, sizes: list[int], engine_args: dict, prompts, max_tokens: int) -> dict:
    want, _, _ = run(model, None, engine_args, prompts, max_tokens)
    results = {}
    for n in sizes:
        got, preempted, hits = run(model, n, engine_args, prompts, max_tokens)
        results[f"{name}/tp{n}"] = {"equal": got == want, "preempted": preempted, "prefix_hits": hits}
    return results


def refused(model: str | None, tp_size: int, engine_args: dict) -> str:
    try:
        LLMEngine(EngineArgs(model=model, tensor_parallel_size=tp_size, **engine_args))
    except ValueError as e:
        return str(e)
    return "accepted"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", help="MODEL_DIR=N,N,...: a model and the sizes to run it at")
    parser.add_argument("--default-model", action="store_true", help="also the default model at N = 3 (and 2)")
    parser.add_argument("--refused", nargs="*", default=[], help="MODEL_DIR=N: a size expected to be refused")
    args = parser.parse_args()
    results = {"refused": {}}
    for spec in args.models:
        model, sizes = spec.rsplit("=", 1)
        results.update(compare(Path(model).name, model, [int(n) for n in sizes.split(",")], TINY, workload(),
                               max_tokens=32))
    if args.default_model:
        default = dict(max_model_len=256, max_num_seqs=2, max_num_batched_tokens=64)
        results.update(compare("default", None, [3], default, [[504, 3575, 282, 4649, 314], list(range(900, 960))],
                               max_tokens=8))
        results["refused"]["default/tp2"] = refused(None, 2, default)
    for spec in args.refused:
        model, size = spec.rsplit("=", 1)
        results["refused"][f"{Path(model).name}/tp{size}"] = refused(model, int(size), TINY)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
