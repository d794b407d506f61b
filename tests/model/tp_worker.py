"""Run in a subprocess with 8 fake CPU devices (the device count is fixed when JAX starts): tensor-parallel
forwards against the single-device one. Prints one JSON object: {case: max |logits difference| over the steps}.

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
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params  # noqa: E402
from jaxllm.model import tensor_parallel as tp  # noqa: E402

BLOCK_SIZE = 4
NUM_BLOCKS = 12
SIZES = dict(num_tokens=16, num_seqs=4, max_blocks=6, num_logits=16)


def config(num_kv_heads: int, **overrides) -> ModelConfig:
    base = dict(architecture="llama", vocab_size=250, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=8, num_kv_heads=num_kv_heads, head_dim=16)
    return ModelConfig(**{**base, **overrides})


CASES = {"kv1": config(1), "kv2-bias-tied": config(2, qkv_bias=True, tie_word_embeddings=True, architecture="qwen2"),
         "kv4": config(4), "kv8": config(8)}  # N = 8 replicates KV heads 8x, 4x, 2x and not at all


def steps():
    """Three steps over the pool: two prefills (one chunked), then a chunk continuing one and a decode."""
    yield [SequenceChunk(list(range(3, 14)), 0, [1, 2, 3], "all"), SequenceChunk([7, 8, 9], 0, [4])]
    yield [SequenceChunk(list(range(40, 46)), 11, [1, 2, 3, 5, 6], [0, 5]), SequenceChunk([21], 3, [4])]
    yield [SequenceChunk([30], 17, [1, 2, 3, 5, 6]), SequenceChunk([22], 4, [4, 7]),
           SequenceChunk([9, 10, 11, 12, 13], 0, [8, 9])]


def run(forward, params, kv) -> list[np.ndarray]:
    out = []
    for chunks in steps():
        batch = jax.tree.map(jnp.asarray, build_step_batch(chunks, BLOCK_SIZE, **SIZES))
        logits, kv = forward(params, kv, batch)
        out.append(np.asarray(logits))
    return out


def layout_report(cfg: ModelConfig, n: int) -> dict:
    """Bytes of parameters and KV pool on one device, and the collectives of the compiled step."""
    mesh = tp.make_mesh(n)
    params = tp.shard_params(random_params(cfg, jax.random.key(0)), cfg, mesh)
    kv = tp.init_sharded_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE, mesh)
    on_device_0 = lambda tree: sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))  # noqa
    batch = jax.tree.map(jnp.asarray, build_step_batch(next(steps()), BLOCK_SIZE, **SIZES))
    hlo = tp.jit_sharded_forward(cfg, mesh).lower(params, kv, batch).compile().as_text()
    return {"param_bytes": on_device_0(params), "kv_bytes": on_device_0(kv),
            "all_reduce": hlo.count(" all-reduce("), "all_gather": hlo.count(" all-gather(")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attention", default="reference")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    results = {}
    for name in args.cases.split(","):
        cfg = CASES[name]
        params = random_params(cfg, jax.random.key(0), scale=0.1)
        want = run(jit_forward(cfg, args.attention), params, init_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE))
        for n in tp.valid_tp_sizes(cfg, max_size=8):
            mesh = tp.make_mesh(n)
            got = run(tp.jit_sharded_forward(cfg, mesh, args.attention), tp.shard_params(params, cfg, mesh),
                      tp.init_sharded_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE, mesh))
            results[f"{name}/tp{n}"] = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    report = {n: layout_report(CASES["kv8"], n) for n in (1, 2, 4, 8)}
    print(json.dumps({"max_abs_diff": results, "layout": report}))


if __name__ == "__main__":
    main()
