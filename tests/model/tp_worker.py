"""Run in a subprocess with 8 fake CPU devices (the device count is fixed when JAX starts): tensor-parallel
forwards against the single-device one. Prints one JSON object: {"CASE/tpN": {max_abs_diff of the logits over the steps,
param_bytes and kv_bytes on one device, all_reduce count in the compiled step}}.

    python -m tests.model.tp_worker [--attention reference|pallas]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxllm.config import ModelConfig  # noqa: E402
from jaxllm.model import (SequenceChunk, StepBatch, build_step_batch, init_kv_cache, jit_forward,  # noqa: E402
                          random_params)
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


def steps():
    """Three steps over the pool: two prefills (one chunked), then a chunk continuing one and a decode."""
    yield [SequenceChunk(list(range(3, 14)), 0, [1, 2, 3], "all"), SequenceChunk([7, 8, 9], 0, [4])]
    yield [SequenceChunk(list(range(40, 46)), 11, [1, 2, 3, 5, 6], [0, 5]), SequenceChunk([21], 3, [4])]
    yield [SequenceChunk([30], 17, [1, 2, 3, 5, 6]), SequenceChunk([22], 4, [4, 7]),
           SequenceChunk([9, 10, 11, 12, 13], 0, [8, 9])]


def batches() -> list[StepBatch]:
    return [jax.tree.map(jnp.asarray, build_step_batch(chunks, BLOCK_SIZE, **SIZES)) for chunks in steps()]


def run(forward, params, kv) -> list[np.ndarray]:
    out = []
    for batch in batches():
        logits, kv = forward(params, kv, batch)
        out.append(np.asarray(logits))
    return out


def sharded_case(cfg: ModelConfig, params, n: int, attention: str, want: list[np.ndarray]) -> dict:
    """The sharded step compiled once (every step has the same shapes): its logits against `want`, the bytes of
    parameters and pool on one device, and the all-reduces in its compiled HLO."""
    mesh = tp.make_mesh(n)
    params = tp.shard_params(params, cfg, mesh)
    kv = tp.init_sharded_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE, mesh)
    compiled = tp.jit_sharded_forward(cfg, mesh, attention).lower(params, kv, batches()[0]).compile()
    on_device_0 = lambda tree: sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))  # noqa
    report = {"param_bytes": on_device_0(params), "kv_bytes": on_device_0(kv),
              "all_reduce": compiled.as_text().count(" all-reduce(")}
    got = run(compiled, params, kv)
    report["max_abs_diff"] = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attention", default="reference")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    results = {}
    for name in args.cases.split(","):
        cfg, sizes = CASES[name]
        params = random_params(cfg, jax.random.key(0), scale=0.1)
        want = run(jit_forward(cfg, args.attention), params, init_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE))
        for n in sizes:
            results[f"{name}/tp{n}"] = sharded_case(cfg, params, n, args.attention, want)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
