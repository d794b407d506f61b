"""How close the decode step is to this machine's ceiling: achieved FLOP/s and bytes/s of the jitted step
(XLA's cost analysis over the measured median) against a big matmul and a big copy timed in the same run.

    python benchmarks/decode_roofline.py [--batch-sizes 1 8 32 64] [--context 96]

Each step is timed twice: with the reference attention and with attention replaced by the identity (a lower
bound: every matmul, norm and the K/V write, no attention), which splits the step's time between the matmuls
and attention. The steps are jitted without donating the KV pool (the harness reruns the same inputs), so XLA
copies the pool into a fresh output each run (the engine donates it): the pool is sized to the batch, and the
"pool_copy_ms" column estimates that copy at the measured copy rate, to be subtracted from the step time.
"""

from __future__ import annotations

import argparse
import functools

import jax.numpy as jnp

from jaxllm.benchmarks.harness import format_table, measure_ceiling, time_jitted
from jaxllm.loaders import load_model
from jaxllm.model import SequenceChunk, build_step_batch, forward, init_kv_cache
from jaxllm.model.attention import ATTENTION_BACKENDS

BLOCK_SIZE = 16
ATTENTION_BACKENDS["identity (no attention)"] = lambda q, k_pool, v_pool, layer, batch, sm_scale: q


def decode_inputs(config, batch_size: int, context: int):
    blocks = -(-(context + 1) // BLOCK_SIZE)
    kv = init_kv_cache(config, 1 + batch_size * blocks, BLOCK_SIZE, jnp.float32)
    chunks = [SequenceChunk([7], context, list(range(1 + i * blocks, 1 + (i + 1) * blocks)))
              for i in range(batch_size)]
    return kv, build_step_batch(chunks, BLOCK_SIZE)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=96, help="cached tokens per sequence")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()

    ceiling = measure_ceiling()
    print(f"ceiling: matmul {ceiling.matmul_flops_per_s / 1e9:.1f} GFLOP/s ({ceiling.matmul_n}^3 float32), "
          f"copy {ceiling.copy_bytes_per_s / 1e9:.1f} GB/s ({ceiling.copy_mib} MiB read + written)\n", flush=True)
    loaded = load_model()
    rows = []
    for batch_size in args.batch_sizes:
        kv, batch = decode_inputs(loaded.config, batch_size, args.context)
        for attention in ("reference", "identity (no attention)"):
            step = functools.partial(forward, config=loaded.config, attention=attention)
            timing = time_jitted(step, loaded.params, kv, batch, name=f"b{batch_size} {attention}",
                                 iters=args.iters)
            row = timing.row(ceiling)
            row["tokens_per_s"] = batch_size / timing.median_s
            pool_bytes = 2 * (kv.k.nbytes + kv.v.nbytes)  # read + written
            row["pool_copy_ms"] = pool_bytes / ceiling.copy_bytes_per_s * 1e3
            rows.append(row)
            print(format_table([row]).splitlines()[-1], flush=True)
    print("\n" + format_table(rows))


if __name__ == "__main__":
    main()
