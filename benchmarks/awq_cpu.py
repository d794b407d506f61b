"""Int4 AWQ weights vs float: parameter bytes, and CPU step time of the same model through the reference path.

    python benchmarks/awq_cpu.py                  # the default model (RTN int4, group 64) vs float32
    python benchmarks/awq_cpu.py --repeats 3

Bytes, from the shapes: float32, bf16, and AWQ as jaxllm keeps it in memory (int4 codes, int8 zeros and fp16 scales
per group; embedding, norms and LM head in bf16), for the default model and Llama-3-8B; the default model's AWQ
params are also built and measured (their dense params float32) to check the formula.
Step time: jit_forward (reference attention, the CPU path) on decode steps at batch 1 and 64 with 256 cached tokens
and one 256-token prefill, float32 params vs the same params quantized in memory (quantization/rtn_params.py),
measured side by side in interleaved rounds; the ratio is AWQ / float32 (above 1: AWQ slower). The weights' values
do not change the time, so RTN stands in for AWQ. Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxllm.benchmarks.model_presets import model_preset  # noqa: E402
from jaxllm.config import ModelConfig  # noqa: E402
from jaxllm.loaders import load_model  # noqa: E402
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, select_kernels  # noqa: E402
from jaxllm.model.params import LINEAR_FIELDS, abstract_params, param_bytes  # noqa: E402
from jaxllm.quantization.rtn_params import rtn_awq_params  # noqa: E402

GROUP = 64  # the default model's hidden size 576 has no group of 128
BLOCK = 16
CONTEXT = 256
MiB = 2 ** 20


def awq_bytes_from_shapes(config: ModelConfig, group: int, dense_itemsize: int) -> dict:
    """Bytes of a model whose linears are int4 AWQ (codes K*N/2, int8 zeros and fp16 scales per group, the layout
    jaxllm keeps in memory) and whose other params are dense of `dense_itemsize`."""
    shapes = abstract_params(config, jnp.float32)
    linear = sum(getattr(layer, f).size for layer in shapes.layers for f in LINEAR_FIELDS)
    dense = sum(x.size for x in jax.tree.leaves(shapes)) - linear
    return {"int4_codes": linear // 2, "zeros_scales": 3 * linear // group, "dense": dense * dense_itemsize}


def bytes_table(params, config: ModelConfig) -> list[dict]:
    """Per model: float32, bf16 and AWQ bytes (AWQ with its dense params in bf16); for the default model the AWQ
    params are also built and measured (dense params float32), which checks the formula."""
    measured_awq = param_bytes(rtn_awq_params(params, GROUP))
    formula_awq = sum(awq_bytes_from_shapes(config, GROUP, 4).values())
    assert measured_awq == formula_awq, (measured_awq, formula_awq)
    rows = []
    for name, model, group in (("default", config, GROUP), ("Llama-3-8B", model_preset("llama3-8b"), 128)):
        dense = sum(x.size for x in jax.tree.leaves(abstract_params(model, jnp.float32)))
        parts = awq_bytes_from_shapes(model, group, 2)
        awq = sum(parts.values())
        rows.append({"model": name, "group": group, "float32_MiB": 4 * dense / MiB, "bf16_MiB": 2 * dense / MiB,
                     "awq_MiB": awq / MiB, "awq/bf16": awq / (2 * dense),
                     "awq_linears/bf16_linears": (parts["int4_codes"] + parts["zeros_scales"])
                     / (2 * (dense - parts["dense"] // 2))})
    rows[0]["awq_f32_rest_MiB (measured)"] = measured_awq / MiB
    return rows


def steps(config: ModelConfig) -> dict:
    blocks = CONTEXT // BLOCK

    def decode(batch: int):
        return [SequenceChunk([7], CONTEXT - 1, list(range(1 + i * blocks, 1 + (i + 1) * blocks)))
                for i in range(batch)]

    prefill = [SequenceChunk(list(range(3, 3 + CONTEXT)), 0, list(range(1, 1 + blocks)))]
    return {"decode b1": decode(1), "decode b64": decode(64), "prefill 256": prefill}


def time_steps(config: ModelConfig, variants: dict, repeats: int) -> list[dict]:
    forward = jit_forward(config, select_kernels("reference"))
    num_blocks = 1 + 64 * (CONTEXT // BLOCK)
    rows = []
    for name, chunks in steps(config).items():
        batch = jax.device_put(build_step_batch(chunks, BLOCK))
        caches = {v: init_kv_cache(config, num_blocks, BLOCK) for v in variants}
        times = {v: [] for v in variants}
        for v, params in variants.items():  # compile and warm both first
            _, caches[v] = forward(params, caches[v], batch)
        for _ in range(repeats):
            for v, params in variants.items():  # interleaved: both see the same machine state
                start = time.perf_counter()
                logits, caches[v] = forward(params, caches[v], batch)
                logits.block_until_ready()
                times[v].append(time.perf_counter() - start)
        row = {"step": name, **{f"{v}_ms": 1e3 * statistics.median(t) for v, t in times.items()}}
        row["awq/float32"] = row["awq_ms"] / row["float32_ms"]
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    loaded = load_model(None, dtype="float32")
    config, params = loaded.config, loaded.params
    table = bytes_table(params, config)
    awq = jax.device_put(rtn_awq_params(params, GROUP))
    timing = time_steps(config, {"float32": params, "awq": awq}, args.repeats)
    for row in table + timing:
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(json.dumps({"bytes": table, "steps": timing, "group_size": GROUP, "backend": jax.default_backend()}))


if __name__ == "__main__":
    main()
