"""How close the decode step is to this machine's ceiling: the step's model FLOPs over its measured time,
against a big matmul and a big copy timed in the same run (jaxllm.benchmarks.harness).

FLOPs are counted from the config (jaxllm.benchmarks.model_flops: every linear layer, the LM head, attention's
two products over the context), not taken from XLA's cost analysis, which sees nothing inside the attention
kernels (custom calls).

    python benchmarks/decode_roofline.py [--batch-sizes 1 8 32 64] [--context 96] [--dtype float32]
                                         [--attention reference cpu]

Each step is timed with each attention backend named and with attention replaced by the identity (a lower
bound: every matmul, norm and the K/V write, no attention), which splits the step's time between the matmuls
and attention. The steps are jitted without donating the KV pool (the harness reruns the same inputs), so XLA
copies the pool into a fresh output each run (the engine donates it): the pool is sized to the batch, and the
"pool_copy_ms" column estimates that copy at the measured copy rate, to be subtracted from the step time.
"""

from __future__ import annotations

import argparse
import functools
from unittest import mock

import jax.numpy as jnp
from core_forward import BLOCK_SIZE, decode_batch

from jaxllm.benchmarks.harness import format_table, measure_ceiling, time_jitted
from jaxllm.benchmarks.model_flops import decode_step_flops
from jaxllm.loaders import load_model
from jaxllm.model import forward, init_kv_cache, llama, select_kernels

NO_ATTENTION = "identity (no attention)"


def identity_attention(kernels, q, k_pool, v_pool, layer, batch, sm_scale):
    return q


def decode_inputs(config, batch_size: int, context: int, dtype):
    """A pool sized to the batch and a decode step of batch_size sequences with `context` cached tokens each."""
    blocks = -(-(context + 1) // BLOCK_SIZE)
    kv = init_kv_cache(config, 1 + batch_size * blocks, BLOCK_SIZE, dtype)
    return kv, decode_batch(batch_size, context, blocks)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=96, help="cached tokens per sequence")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and KV pool")
    parser.add_argument("--attention", nargs="+", default=["reference", "cpu"], choices=["reference", "cpu"])
    args = parser.parse_args()

    ceiling = measure_ceiling()
    print(f"{args.dtype} step; ceiling: matmul {ceiling.matmul_flops_per_s / 1e9:.1f} GFLOP/s "
          f"({ceiling.matmul_n}^3 float32), "
          f"copy {ceiling.copy_bytes_per_s / 1e9:.1f} GB/s ({ceiling.copy_mib} MiB read + written)\n", flush=True)
    loaded = load_model(dtype=args.dtype)
    rows = []
    for batch_size in args.batch_sizes:
        kv, batch = decode_inputs(loaded.config, batch_size, args.context, jnp.dtype(args.dtype))
        for attention in (*args.attention, NO_ATTENTION):
            kernels = select_kernels("reference" if attention == NO_ATTENTION else attention)
            step = functools.partial(forward, config=loaded.config, kernels=kernels)
            with mock.patch.object(llama, "attend", identity_attention if attention == NO_ATTENTION else llama.attend):
                timing = time_jitted(step, loaded.params, kv, batch, name=f"b{batch_size} {attention}",
                                     iters=args.iters)
            pool_copy_s = 2 * (kv.k.nbytes + kv.v.nbytes) / ceiling.copy_bytes_per_s  # read + written
            step_s = timing.median_s - pool_copy_s
            flops = decode_step_flops(loaded.config, batch_size, args.context, with_attention=attention != NO_ATTENTION)
            row = {"step": timing.name, "median_ms": timing.median_s * 1e3, "p10_ms": timing.p10_s * 1e3,
                   "p90_ms": timing.p90_s * 1e3, "pool_copy_ms (est.)": pool_copy_s * 1e3,
                   "step_ms (net)": step_s * 1e3, "model_gflop": flops / 1e9,
                   "gflop_per_s": flops / step_s / 1e9,
                   "of_matmul_ceiling": flops / step_s / ceiling.matmul_flops_per_s,
                   "tokens_per_s": batch_size / step_s, "compile_s": timing.compile_s}
            rows.append(row)
            print(format_table([row]).splitlines()[-1], flush=True)
    print("\n" + format_table(rows))


if __name__ == "__main__":
    main()
