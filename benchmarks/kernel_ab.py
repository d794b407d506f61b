"""One kernel choice against another through the whole engine: two LLMs of the default model in one process, alike
but for one Kernels field, run compare_vllm.py's workloads in turn (greedy, EOS ignored), rounds alternated.

    cd benchmarks && python kernel_ab.py --field argmax --values reference cpu [--workloads fixed mixed] [--rounds 2]

Prints each round's output tok/s per value, the ratio of the medians to the first value, and whether the two
engines' outputs were identical token for token (on the warm-up pass).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from compare_vllm import make_requests, workload_shapes

import jaxllm.engine.engine as engine_module
from jaxllm.llm import LLM
from jaxllm.loaders.resolve import resolve_model
from jaxllm.model.kernels import CHOICES
from jaxllm.sampling_params import SamplingParams
from jaxllm.tokenizer import load_tokenizer


def engine_with(field: str, value: str, dtype: str, args) -> LLM:
    """An LLM whose kernels are select_kernels()'s with `field` set to `value`."""
    select = engine_module.select_kernels
    engine_module.select_kernels = lambda *a, **k: dataclasses.replace(select(*a, **k), **{field: value})
    try:
        return LLM(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                   max_model_len=1024, dtype=dtype, compilation_cache=False)
    finally:
        engine_module.select_kernels = select


def generate(llm: LLM, requests) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False) for _, n in requests]
    outputs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--field", required=True, choices=sorted(CHOICES))
    parser.add_argument("--values", nargs=2, required=True)
    parser.add_argument("--workloads", nargs="+", choices=["fixed", "mixed"], default=["fixed", "mixed"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--mixed-prompts", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    args = parser.parse_args()

    tokenizer = load_tokenizer(resolve_model(None))
    engines = {value: engine_with(args.field, value, args.dtype, args) for value in args.values}
    first = args.values[0]
    print(f"| workload | {' | '.join(f'{args.field}={v} tok/s' for v in args.values)} | ratio to {first} | "
          f"identical outputs |\n|---|{'---|' * len(args.values)}---:|---|")
    for name in args.workloads:
        shapes = workload_shapes(name, args)
        warmup, measured = make_requests(tokenizer, shapes, 1), make_requests(tokenizer, shapes, 0)
        outputs = {value: generate(llm, warmup) for value, llm in engines.items()}
        identical = sum(a == b for a, b in zip(*outputs.values()))
        rates = {value: [] for value in engines}
        for _ in range(args.rounds):
            for value, llm in engines.items():
                start = time.perf_counter()
                tokens = sum(len(t) for t in generate(llm, measured))
                rates[value].append(tokens / (time.perf_counter() - start))
        medians = {value: statistics.median(r) for value, r in rates.items()}
        cells = " | ".join(", ".join(f"{r:.1f}" for r in rates[v]) for v in args.values)
        ratio = medians[args.values[1]] / medians[first]
        print(f"| {name} | {cells} | {ratio:.3f} | {identical}/{len(warmup)} |", flush=True)


if __name__ == "__main__":
    main()
