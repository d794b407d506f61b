"""Paged attention on the CPU: one layer's decode call vs batch size and context length, per backend.

    python benchmarks/attention_cpu.py [--batch-sizes 1 8 32 64] [--contexts 128 512 2048 4096] [--dtype float32]
                                       [--backends reference cpu] [--prefill]
                                       [--sliding-window W] [--logit-softcap C] [--cold]

The attention shape is the default model's (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64), block size 16.
`reference` is the jnp reference, `cpu` the C++ FFI kernel (cpu_kernel.cc); the backends of one shape run one
after the other on the same inputs. Prints a markdown table: median milliseconds per layer call, the same times the
model's 30 layers, and the KV bytes the call must read per second of its time (with a window: of the keys in
it). `--prefill` times steps with
prompt chunks instead (PREFILL_STEPS), one column per backend.

By default every call reads the same layer, whose K/V then sit in the CPU's caches between calls when they fit
(L2/L3). `--cold` gives the pool the model's 30 layers and has each call read the next one, as the model's forward
does: each layer's K/V come from memory. A kernel change can win warm and not cold (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from pallas_kernels.paged_attention import ragged_paged_attention_reference  # noqa: E402
from pallas_kernels.paged_attention.cpu_kernel import cpu_ragged_paged_attention  # noqa: E402
from pallas_kernels.paged_attention.testing import random_ragged_case  # noqa: E402

BACKENDS = {"reference": ragged_paged_attention_reference, "cpu": cpu_ragged_paged_attention}

LAYOUT = dict(num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16)
NUM_LAYERS = 30


# Steps with prompt chunks: name -> (q_len, context_len) per sequence (`--prefill`).
PREFILL_STEPS = {
    "one 448-token prompt": [(448, 448)],
    "four 112-token prompts": [(112, 112)] * 4,
    "a 256-token chunk after a 256-token prefix": [(256, 512)],
    "8 x 64-token prompts + 56 decode rows at 300": [(64, 64)] * 8 + [(1, 300)] * 56,
}


def time_decode(backend: str, batch: int, context: int, dtype, repeats: int, layers: int = 1,
                **options) -> tuple[float, int]:
    """(median seconds per call, KV bytes read per call) for `batch` sequences of one query token each.
    options: sliding_window, logit_softcap."""
    sec = time_step(backend, [(1, context)] * batch, dtype, repeats, layers, **options)
    keys = min(context, options.get("sliding_window") or context)
    kv_bytes = 2 * batch * keys * LAYOUT["num_kv_heads"] * LAYOUT["head_dim"] * jnp.dtype(dtype).itemsize
    return sec, kv_bytes


def time_step(backend: str, seqs: list[tuple[int, int]], dtype, repeats: int, layers: int = 1,
              **options) -> float:
    """Median seconds of one layer's attention call over sequences of (q_len, context_len); the calls read the
    pool's `layers` layers in turn."""
    case = random_ragged_case(0, seqs, dtype=dtype, num_layers=layers, **LAYOUT)
    attend = jax.jit(functools.partial(BACKENDS[backend], sm_scale=LAYOUT["head_dim"] ** -0.5, **options))
    layer_ids = [jnp.int32(i) for i in range(layers)]
    jax.block_until_ready(attend(*case._replace(layer=layer_ids[0]).args()))
    times = []
    for call in range(repeats * layers):
        args = case._replace(layer=layer_ids[call % layers]).args()
        start = time.perf_counter()
        jax.block_until_ready(attend(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_prefill(backends: list[str], dtype, repeats: int, layers: int, **options) -> None:
    print("| step | " + " | ".join(f"{b}: ms / layer" for b in backends) + " |")
    print("|---|" + "---:|" * len(backends))
    for name, seqs in PREFILL_STEPS.items():
        times = [time_step(backend, seqs, dtype, repeats, layers, **options) * 1e3 for backend in backends]
        print(f"| {name} | " + " | ".join(f"{t:.2f}" for t in times) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048, 4096])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--backends", nargs="+", default=["reference", "cpu"], choices=sorted(BACKENDS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--prefill", action="store_true", help="time steps with prompt chunks instead")
    parser.add_argument("--sliding-window", type=int, default=None, help="attend to each query's last W keys")
    parser.add_argument("--logit-softcap", type=float, default=None, help="soft-cap the attention scores")
    parser.add_argument("--cold", action="store_true",
                        help=f"a pool of {NUM_LAYERS} layers, read in turn: each call's K/V come from memory")
    args = parser.parse_args()
    layers = NUM_LAYERS if args.cold else 1
    options = dict(sliding_window=args.sliding_window, logit_softcap=args.logit_softcap)

    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs, {args.dtype}, "
          f"sliding_window {args.sliding_window}, logit_softcap {args.logit_softcap}, "
          f"{'cold: each call reads the next of 30 layers' if args.cold else 'one layer'}\n")
    if args.prefill:
        print_prefill(args.backends, jnp.dtype(args.dtype), args.repeats, layers, **options)
        return
    print("| backend | batch | context | ms / layer | ms / step (30 layers) | KV read GB/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for batch in args.batch_sizes:
        for context in args.contexts:
            for backend in args.backends:
                sec, kv_bytes = time_decode(backend, batch, context, jnp.dtype(args.dtype), args.repeats, layers,
                                            **options)
                ms = sec * 1e3
                print(f"| {backend} | {batch} | {context} | {ms:.3f} | {ms * NUM_LAYERS:.1f} | "
                      f"{kv_bytes / sec / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()
