"""Run in a subprocess with 8 fake CPU devices (the device count is fixed when JAX starts): tensor-parallel
forwards against the single-device one. Prints one JSON object: {"CASE/tpN": {max_abs_diff of the logits over the steps,
param_bytes and kv_bytes on one device, all_reduce count in the compiled step}}.

    python -m tests.model.tp_worker [--attention reference|pallas] [--only kv1/tp2,kv8/tp1,...]

With --attention pallas the Pallas kernels run in interpret mode under shard_map: the ragged kernel on the mixed
steps, the split-KV kernel on the decode-only one.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # run as the worker; a test importing its cases must not leak 8 devices to its children
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxllm.config import ModelConfig  # noqa: E402
from jaxllm.model import (SequenceChunk, StepBatch, build_step_batch, init_kv_cache, jit_forward,  # noqa: E402
                          random_params, select_kernels)
from jaxllm.model import tensor_parallel as tp  # noqa: E402

BLOCK_SIZE = 4
NUM_BLOCKS = 12
SIZES = dict(num_tokens=16, num_seqs=4, max_blocks=6, num_logits=16)


def config(num_kv_heads: int, **overrides) -> ModelConfig:
    base = dict(architecture="llama", vocab_size=250, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=8, num_kv_heads=num_kv_heads, head_dim=16)
    return ModelConfig(**{**base, **overrides})


CASES = {  # name -> (config, sizes N): KV heads replicated 8x (kv1), 4x and 2x (kv2), not at all (kv8)
    "kv1": (config(1), (1, 2, 4, 8)),
    "kv2-bias-tied": (config(2, qkv_bias=True, tie_word_embeddings=True, architecture="qwen2"), (2, 4)),
    "kv8": (config(8), (1, 2, 4, 8)),
}


def steps(attention: str):
    """Steps over the pool: two prefills (one chunked), then a chunk continuing one and a decode; on the Pallas path
    a decode-only step too (batch.decode_only picks the split-KV kernel; the reference ignores the flag, so the
    step would only cost the reference runs a second compile)."""
    yield [SequenceChunk(list(range(3, 14)), 0, [1, 2, 3], "all"), SequenceChunk([7, 8, 9], 0, [4])]
    yield [SequenceChunk(list(range(40, 46)), 11, [1, 2, 3, 5, 6], [0, 5]), SequenceChunk([21], 3, [4])]
    yield [SequenceChunk([30], 17, [1, 2, 3, 5, 6]), SequenceChunk([22], 4, [4, 7]),
           SequenceChunk([9, 10, 11, 12, 13], 0, [8, 9])]
    if attention == "pallas":
        yield [SequenceChunk([31], 18, [1, 2, 3, 5, 6]), SequenceChunk([23], 5, [4, 7]),
               SequenceChunk([14], 5, [8, 9])]


def batches(attention: str = "reference") -> list[StepBatch]:
    return [jax.tree.map(jnp.asarray, build_step_batch(chunks, BLOCK_SIZE, **SIZES)) for chunks in steps(attention)]


def run(forward, params, kv, attention: str) -> list[np.ndarray]:
    out = []
    for batch in batches(attention):
        logits, kv = forward(params, kv, batch)
        out.append(np.asarray(logits))
    return out


def sharded_case(cfg: ModelConfig, params, n: int, attention: str, want: list[np.ndarray]) -> dict:
    """The sharded step (compiled once per kind of step: mixed, and decode-only on the Pallas path): its logits
    against `want`, the bytes of parameters and pool on one device, and the all-reduces in its compiled HLO (jit
    reuses that compile)."""
    mesh = tp.make_mesh(n)
    params = tp.shard_params(params, cfg, mesh)
    kv = tp.init_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE, mesh=mesh)
    forward = tp.jit_forward(cfg, select_kernels(attention), mesh=mesh)
    compiled = forward.lower(params, kv, batches()[0]).compile()
    on_device_0 = lambda tree: sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))  # noqa
    report = {"param_bytes": on_device_0(params), "kv_bytes": on_device_0(kv),
              "all_reduce": compiled.as_text().count(" all-reduce(")}
    got = run(forward, params, kv, attention)
    report["max_abs_diff"] = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attention", default="reference")
    parser.add_argument("--only", default="", help="comma-separated CASE/tpN runs (default: every case and size)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    results = {}
    for name, (cfg, sizes) in CASES.items():
        sizes = [n for n in sizes if not only or f"{name}/tp{n}" in only]
        if not sizes:
            continue
        params = random_params(cfg, jax.random.key(0), scale=0.1)
        want = run(jit_forward(cfg, select_kernels(args.attention)), params,
                   init_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE),
                   args.attention)
        for n in sizes:
            results[f"{name}/tp{n}"] = sharded_case(cfg, params, n, args.attention, want)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
