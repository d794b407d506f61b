"""Padded share of the token rows the forward programs compute, on the mixed workload's shapes.

    python benchmarks/padding.py [--max-num-seqs 64] [--max-num-batched-tokens 512] [--num-requests 128]

A forward program of T tokens computes every row of its bucket (bucketing.Buckets: powers of two); rows past the
step's scheduled tokens are padding (runner.token_counts counts both). The workload is compare_hf.py's "mixed"
one (prompt and output lengths drawn in 16-256 with seed 0) on a tiny random-weight model: padding depends on the
scheduler and the buckets only, not on the weights. Prints the padded fraction over the run, for decode-only
steps and for steps with prefill chunks.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import numpy as np

from jaxllm.benchmarks.datasets import mixed_lengths
from jaxllm.benchmarks.model_presets import model_preset
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.loaders import LoadedModel
from jaxllm.model import random_params
from jaxllm.sampling_params import SamplingParams


def run(max_num_seqs: int, max_num_batched_tokens: int, num_requests: int) -> dict:
    config = dataclasses.replace(model_preset("tiny"), max_position_embeddings=1024)
    loaded = LoadedModel(config, random_params(config, jax.random.key(0)), source=None)
    engine = LLMEngine(EngineArgs(skip_tokenizer=True, max_num_seqs=max_num_seqs, max_model_len=1024,
                                  max_num_batched_tokens=max_num_batched_tokens, warmup=False), loaded=loaded)
    by_kind = {"decode-only": [0, 0, 0], "with prefill": [0, 0, 0]}  # scheduled, computed, steps
    dispatch = engine.runner.dispatch

    def counting_dispatch(out):
        step = dispatch(out)
        kind = by_kind["decode-only" if all(c.num_new_tokens == 1 for c in out.chunks) else "with prefill"]
        kind[0] += out.num_tokens
        kind[1] += step.inputs.forward_key.size
        kind[2] += 1
        return step

    engine.runner.dispatch = counting_dispatch
    rng = np.random.default_rng(0)
    for i, (prompt_len, output_len) in enumerate(mixed_lengths(np.random.RandomState(0), num_requests)):
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
        engine.add_request(str(i), rng.integers(0, config.vocab_size, size=prompt_len).tolist(), params)
    while engine.has_unfinished_requests():
        engine.step()
    counts = engine.runner.token_counts
    return {"all": (counts.scheduled, counts.computed, counts.steps), **{k: tuple(v) for k, v in by_kind.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--num-requests", type=int, default=128)
    args = parser.parse_args()
    result = run(args.max_num_seqs, args.max_num_batched_tokens, args.num_requests)
    print(f"max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}, "
          f"{args.num_requests} mixed requests\n")
    print("| steps | count | scheduled tokens | computed rows | padded fraction |\n|---|---:|---:|---:|---:|")
    for kind, (scheduled, computed, steps) in result.items():
        print(f"| {kind} | {steps} | {scheduled} | {computed} | {1 - scheduled / max(computed, 1):.3f} |")


if __name__ == "__main__":
    main()
