"""A whole decode step of a windowed model against the same model without its window, as the context grows.

    python benchmarks/windowed_step.py [--window 512] [--contexts 512 2048 8192] [--batch-sizes 1 8] [--layers 4]

The default model's layer shapes (SmolLM2-135M: 9 query heads, 3 KV heads, head size 64), `--layers` of them, with
random float32 weights, every layer windowed or none. Both models run in one process, one after the other, through
the one jitted forward (the KV pool donated); each step time is the median of `--repeats` after a first call that
compiles. With a window, every implementation's key loop starts at the window, so the step time should stay flat
once the context passes it; without one it grows with the context.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform

import jax
import jax.numpy as jnp

from core_forward import BLOCK_SIZE, decode_batch, time_step
from jaxllm.benchmarks.model_presets import model_preset
from jaxllm.benchmarks.random_weights import device_random_params
from jaxllm.model import init_kv_cache, jit_forward


def step_times(config, batch_sizes, contexts, repeats) -> dict[tuple[int, int], float]:
    """(batch size, context) -> median decode-step seconds for `config`."""
    params = device_random_params(config, dtype=jnp.float32)
    blocks_per_seq = -(-(max(contexts) + 1) // BLOCK_SIZE)
    kv = init_kv_cache(config, 1 + max(batch_sizes) * blocks_per_seq, BLOCK_SIZE, jnp.float32)
    forward = jit_forward(config)
    times = {}
    for batch_size in batch_sizes:
        for context in contexts:
            batch = decode_batch(batch_size, context, blocks_per_seq)
            _, median, _, kv = time_step(forward, params, kv, batch, repeats)
            times[batch_size, context] = median
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.default_backend()} ({platform.processor() or platform.machine()})",
          flush=True)
    base = dataclasses.replace(model_preset("smollm2-135m"), num_layers=args.layers,
                               max_position_embeddings=max(args.contexts) + 1)
    models = {"no window": base, f"window {args.window}": dataclasses.replace(base, sliding_window=args.window)}
    results = {name: step_times(config, args.batch_sizes, args.contexts, args.repeats)
               for name, config in models.items()}
    first = args.contexts[0]
    print("| model | batch | " + " | ".join(f"ctx {c} ms (x ctx {first})" for c in args.contexts) + " |")
    print("|---|---:|" + "---:|" * len(args.contexts))
    for name, times in results.items():
        for b in args.batch_sizes:
            cells = [f"{times[b, c] * 1e3:.2f} ({times[b, c] / times[b, first]:.2f}x)" for c in args.contexts]
            print(f"| {name} | {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
