"""Sampler step time on this machine: greedy, plain temperature and top-p batches at several row counts.

    python benchmarks/sampler_cpu.py [--rows 1 32 256] [--vocab 49152] [--repeats 5]

Prints a markdown table: median device time of the jitted `sample` per variant (after one compiling call),
and the host time of `build_sampling_batch`. Logits are Gaussian with scale 8 ("peaked": a top-p 0.9 nucleus
of a few tokens, like a language model's usual next-token distribution) or scale 1 ("flat": a nucleus of
thousands of tokens, beyond the top-k candidates, so the exact bisection runs for that row); "1/16 flat" makes
every 16th row flat. The threefry variant samples with jax.random's threefry Gumbel noise per row, the per-logit
noise the sampler avoids, for comparison. The last two time the greedy argmax alone: jnp.argmax (XLA's) and the
native kernel (pallas_kernels/argmax) that `sample` takes where Kernels.argmax is "cpu"; the sampler rows run with
select_kernels()'s choice.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxllm.model.kernels import select_kernels
from jaxllm.sampler import sample
from pallas_kernels.argmax.cpu import argmax_rows_cpu
from pallas_kernels.argmax.reference import argmax_rows
from jaxllm.sampling_batch import SamplingRow, build_sampling_batch
from jaxllm.sampling_params import SamplingParams

VARIANTS = {  # name -> (sampling params, fraction of flat rows)
    "greedy": (dict(temperature=0.0), 0),
    "temperature 0.8": (dict(temperature=0.8), 0),
    "top-p 0.9, peaked": (dict(temperature=0.8, top_p=0.9), 0),
    "top-p 0.9, 1/16 flat": (dict(temperature=0.8, top_p=0.9), 1 / 16),
    "top-p 0.9, all flat": (dict(temperature=0.8, top_p=0.9), 1),
}


def threefry_sample(logits, temperature, keys):
    """Reference: temperature sampling with jax.random Gumbel noise drawn per row."""
    noise = jax.vmap(lambda key: jax.random.gumbel(key, logits.shape[1:]))(keys)
    return jnp.argmax(logits / temperature[:, None] + noise, axis=-1)


def median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(num_rows: int, vocab: int, repeats: int) -> dict[str, tuple[float, float]]:
    """variant -> (device seconds, host build seconds) for one row count."""
    rng = np.random.RandomState(0)
    kernels = select_kernels()
    sample_fn = jax.jit(lambda logits, batch: sample(logits, batch, kernels))
    results = {}
    for name, (params, flat) in VARIANTS.items():
        scale = np.where(np.arange(num_rows) % round(1 / flat) == 0, 1.0, 8.0) if flat else np.full(num_rows, 8.0)
        logits = jnp.asarray(rng.randn(num_rows, vocab).astype(np.float32) * scale[:, None].astype(np.float32))
        rows = [SamplingRow(SamplingParams(**params), [1, 2, 3], [4] * 10, rng_stream=i) for i in range(num_rows)]
        start = time.perf_counter()
        batch = build_sampling_batch(rows, num_rows, vocab)
        host = time.perf_counter() - start
        results[name] = (median_seconds(lambda: sample_fn(logits, batch), repeats), host)
    logits = jnp.asarray(rng.randn(num_rows, vocab).astype(np.float32) * 8)
    keys = jax.random.split(jax.random.key(0), num_rows)
    temperature = jnp.full(num_rows, 0.8)
    reference = jax.jit(threefry_sample)
    results["temperature 0.8, threefry noise"] = (
        median_seconds(lambda: reference(logits, temperature, keys), repeats), float("nan"))
    for name, fn in (("argmax alone: jnp.argmax", argmax_rows), ("argmax alone: native kernel", argmax_rows_cpu)):
        compiled = jax.jit(fn)
        results[name] = (median_seconds(lambda: compiled(logits), repeats), float("nan"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    by_rows = {r: measure(r, args.vocab, args.repeats) for r in args.rows}
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, V = {args.vocab}, "
          f"median of {args.repeats}; ms (device sample / host build_sampling_batch)\n")
    print("| variant | " + " | ".join(f"R = {r}" for r in args.rows) + " |")
    print("|---|" + "---|" * len(args.rows))
    for name in next(iter(by_rows.values())):
        cells = []
        for r in args.rows:
            device, host = by_rows[r][name]
            cells.append(f"{device * 1e3:.1f}" + ("" if np.isnan(host) else f" / {host * 1e3:.1f}"))
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
