"""The default model's jitted forward with the old dense-dot dispatch and the native skinny kernel, alternated in one
run: batch 1 (one decode token) and 5 tokens of one sequence (a speculative-decoding verify step, logits for all).

    python benchmarks/skinny_forward.py [--dtypes float32 bfloat16] [--tokens 1 5] [--iters 15] [--context 96]

Three dispatches of the dense dots (Kernels.matvec16; the LM head's dot too where named):
    old        "two_rows" in the layers (XLA's dots; a one-row dot with a 16-bit weight as a two-row product),
               XLA's plain dot in the LM head (the dispatch before the native kernel)
    two_rows   "two_rows" in the layers and the LM head
    native     "native": the skinny kernel (pallas_kernels/skinny_matmul) for the dense 2-D weights' dots with at
               most 8 rows (not a one-row dot with a float32 weight), in the layers and the LM head
Each call is timed alone, the dispatches in turn; the table gives medians and the ratios to native.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from core_forward import BLOCK_SIZE

from jaxllm.loaders import load_model
from jaxllm.model import SequenceChunk, build_step_batch, compute_logits, forward_hidden, init_kv_cache, select_kernels
from jaxllm.model.kernels import REFERENCE

DISPATCHES = {"old": ("two_rows", "direct"), "two_rows": ("two_rows", "two_rows"), "native": ("native", "native")}


def step_program(config, kernels, head_kernels):
    """The jitted forward: logits [R, V] of the layers run with `kernels`, the LM head's dot with `head_kernels`."""
    def step(params, kv, batch):
        hidden, _ = forward_hidden(params, kv, batch, config=config, kernels=kernels)  # [R, H]
        return compute_logits(params, hidden, config.vocab_size, config.final_logit_softcap, head_kernels)
    return jax.jit(step)


def step_inputs(config, num_tokens: int, context: int, dtype):
    """A pool for one sequence and a step of `num_tokens` new tokens after `context` cached ones, logits for all."""
    blocks = -(-(context + num_tokens) // BLOCK_SIZE)
    kv = init_kv_cache(config, 1 + blocks, BLOCK_SIZE, dtype)
    chunk = SequenceChunk(list(range(7, 7 + num_tokens)), context, list(range(1, 1 + blocks)), want_logits="all")
    return kv, build_step_batch([chunk], BLOCK_SIZE)


def time_alternated(steps: dict, args: tuple, iters: int) -> dict:
    """Median seconds of each compiled step, the steps run in turn `iters` times (after two warm-up rounds)."""
    times = {name: [] for name in steps}
    for round_index in range(iters + 2):
        for name, step in steps.items():
            start = time.perf_counter()
            jax.block_until_ready(step(*args))
            if round_index >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--context", type=int, default=96, help="cached tokens of the sequence")
    args = parser.parse_args()

    base = select_kernels()
    print(f"{'dtype':9} {'tokens':>6} {'old_ms':>8} {'two_rows_ms':>11} {'native_ms':>9} {'old/native':>10} "
          f"{'two_rows/native':>15} {'max|dlogit|':>11} argmax")
    for dtype in args.dtypes:
        loaded = load_model(dtype=dtype)
        for num_tokens in args.tokens:
            kv, batch = step_inputs(loaded.config, num_tokens, args.context, jnp.dtype(dtype))
            steps = {name: step_program(loaded.config, dataclasses.replace(base, matvec16=layers),
                                        dataclasses.replace(REFERENCE, matvec16=head))
                     for name, (layers, head) in DISPATCHES.items()}
            logits = {name: np.asarray(step(loaded.params, kv, batch)) for name, step in steps.items()}
            ms = {name: t * 1e3 for name, t in time_alternated(steps, (loaded.params, kv, batch), args.iters).items()}
            diff = np.abs(logits["native"] - logits["old"]).max()
            same = (logits["native"].argmax(-1) == logits["old"].argmax(-1)).all()
            print(f"{dtype:9} {num_tokens:6d} {ms['old']:8.1f} {ms['two_rows']:11.1f} {ms['native']:9.1f} "
                  f"{ms['old'] / ms['native']:10.2f} {ms['two_rows'] / ms['native']:15.2f} {diff:11.2e} "
                  f"{'same' if same else 'different'}", flush=True)

if __name__ == "__main__":
    main()
