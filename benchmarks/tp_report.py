"""Tensor parallelism, measured on fake CPU devices and worked out on paper (jaxllm/model/tensor_parallel.py).

    python benchmarks/tp_report.py [--iters 20]

Prints markdown tables:
  (a) parameter and KV-pool bytes on one device at N = 1, 2, 4, 8: a small random model measured on the devices
      (addressable_shards[0]) beside the same figure computed from abstract shapes, then Llama-3-8B and -70B in
      bfloat16 computed from abstract shapes and the layout's own PartitionSpecs (PARAM_AXES, AXIS_RULES);
  (b) collectives in the compiled HLO of the sharded step and of the engine's programs, split into those in loop
      bodies (a forward's is the scanned layer body: run once per layer; the sampler's is its exact top-k/top-p
      bisection, run only when a row's kept set exceeds its candidates) and those outside loops (once per step);
  (c) step time of the small model on fake CPU devices, for the record only: the N fake devices share this
      machine's cores, so more devices only add partitioning and collective overhead here;
  (d) on paper: what a Llama-3-70B decode token's all-reduces cost over H200 NVLink at N = 8, against the step's
      weight read.

The device count is fixed when JAX starts: this script asks for 8 fake CPU devices before importing it.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Iterator  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from jaxllm.benchmarks.harness import format_table  # noqa: E402
from jaxllm.config import ModelConfig  # noqa: E402
from jaxllm.engine.bucketing import Buckets, ProgramKey  # noqa: E402
from jaxllm.engine.step_programs import StepPrograms  # noqa: E402
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params  # noqa: E402
from jaxllm.model import tensor_parallel as tp  # noqa: E402
from jaxllm.model.params import abstract_params  # noqa: E402
from jaxllm.model.kernels import REFERENCE  # noqa: E402

SIZES = (1, 2, 4, 8)
BLOCK_SIZE = 16
KV_TOKENS = 1024  # KV pool sizes are given per 1,024 cached tokens
SMALL = ModelConfig(architecture="llama", vocab_size=2048, hidden_size=256, intermediate_size=1024, num_layers=4,
                    num_heads=8, num_kv_heads=2, head_dim=32)  # 2 KV heads: replicated at N = 4, 8
LLAMA3 = {  # shapes of the Hugging Face configs
    "Llama-3-8B": ModelConfig(architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                              num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128),
    "Llama-3-70B": ModelConfig(architecture="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                               num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128),
}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
# (d): H200 figures
NVLINK_BYTES_PER_S = 450e9  # NVLink 4: 900 GB/s per GPU both ways together, ~450 GB/s each way
HBM_BYTES_PER_S = 4.8e12
ALL_REDUCE_LATENCY_S = 5e-6  # a small-message all-reduce over NVLink: a few microseconds


# ------------------------------------------------------------------------------------------ (a) bytes
def per_device_bytes(params, config: ModelConfig, n: int) -> dict:
    """Bytes of one device's params (abstract or real, ordinary layout) once laid out and split over n devices:
    the shard shapes come from param_shardings, i.e. PARAM_AXES and AXIS_RULES."""
    mesh = tp.make_mesh(n)
    laid_out = jax.eval_shape(functools.partial(tp.shard_major_params, config=config, tp_size=n), params)
    shardings = jax.tree.leaves(tp.param_shardings(laid_out, mesh), is_leaf=lambda x: isinstance(x, NamedSharding))
    split = replicated = 0
    for leaf, sharding in zip(jax.tree.leaves(laid_out), shardings):
        nbytes = math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
        if any(axis is not None for axis in sharding.spec):
            split += nbytes
        else:
            replicated += nbytes
    return {"replicated": replicated, "split": split, "total": replicated + split}


def kv_bytes_per_device(config: ModelConfig, n: int, num_tokens: int, dtype) -> int:
    """One device's share of a pool of num_tokens tokens (K and V), from KV_POOL_AXES' PartitionSpec."""
    heads = tp.kv_heads_per_device(config, n) * n  # KV heads replicated when n > Hkv
    shape = (config.num_layers, num_tokens // BLOCK_SIZE, heads, BLOCK_SIZE, config.head_dim)  # [L, N, Hkv, B, D]
    sharding = NamedSharding(tp.make_mesh(n), tp.spec(tp.KV_POOL_AXES))
    return 2 * math.prod(sharding.shard_shape(shape)) * jnp.dtype(dtype).itemsize


def on_device_0(tree) -> int:
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))


def small_model_bytes(params) -> list[dict]:
    """The small model placed on the devices: measured on device 0 against the abstract computation."""
    rows = []
    for n in SIZES:
        mesh = tp.make_mesh(n)
        placed = tp.shard_params(params, SMALL, mesh)
        kv = tp.init_kv_cache(SMALL, KV_TOKENS // BLOCK_SIZE, BLOCK_SIZE, mesh=mesh)
        computed = per_device_bytes(params, SMALL, n)
        rows.append({"N": n, "params, measured (B)": on_device_0(placed), "params, computed (B)": computed["total"],
                     "of which replicated (B)": computed["replicated"], "KV pool, measured (B)": on_device_0(kv),
                     "KV pool, computed (B)": kv_bytes_per_device(SMALL, n, KV_TOKENS, jnp.float32)})
    return rows


def llama3_bytes() -> list[dict]:
    rows = []
    for name, config in LLAMA3.items():
        params = abstract_params(config, jnp.bfloat16)
        whole = per_device_bytes(params, config, 1)["total"]
        for n in SIZES:
            b = per_device_bytes(params, config, n)
            rows.append({"model": name, "N": n, "params per device (GB)": b["total"] / 1e9,
                         "replicated: embedding, norms (GB)": b["replicated"] / 1e9,
                         "over an even split": f"{b['total'] / (whole / n) - 1:+.1%}",
                         "KV heads per device": tp.kv_heads_per_device(config, n),
                         "KV per 1k tokens per device (MiB)":
                             kv_bytes_per_device(config, n, KV_TOKENS, jnp.bfloat16) / 2**20})
    return rows


# ------------------------------------------------------------------------------------------ (b) collectives
def collectives(hlo_text: str) -> dict:
    """Collective ops of a compiled module, split into those in a while loop's body and the others. Async
    collectives count once (their -start op)."""
    bodies = set(re.findall(r"body=%?([\w.\-]+)", hlo_text))
    counts = {"in loop bodies": {}, "outside loops": {}}
    computation = None
    for line in hlo_text.splitlines():
        header = re.match(r"(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header and not line.startswith(" "):
            computation = header.group(1)
            continue
        op = re.search(r" (" + "|".join(COLLECTIVES) + r")(?:-start)?\(", line)
        if op:
            where = counts["in loop bodies" if computation in bodies else "outside loops"]
            where[op.group(1)] = where.get(op.group(1), 0) + 1
    return counts


def format_counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


@dataclasses.dataclass(frozen=True)
class LargestBuckets(Buckets):
    """The engine's bucket set cut down to one program of each kind, the largest (warm-up builds only these)."""

    def all_programs(self) -> Iterator[ProgramKey]:
        yield ProgramKey("forward", self.token_sizes[-1])
        yield ProgramKey("sample", self.sample_sizes[-1])
        yield ProgramKey("prompt_logprobs")


def collective_rows(params, steps: dict) -> list[dict]:
    """The sharded step (forward + vocabulary-split logits) and the engine's programs (StepPrograms with the mesh:
    forward T=64, sample S=8, prompt logprobs)."""
    rows = []
    for n in SIZES:
        mesh = tp.make_mesh(n)
        placed = tp.shard_params(params, SMALL, mesh)
        kv = tp.init_kv_cache(SMALL, 8, BLOCK_SIZE, mesh=mesh)
        programs = StepPrograms(SMALL, REFERENCE, LargestBuckets(64, 8), max_blocks_per_seq=8, mesh=mesh)
        programs.compile_all(placed, kv)
        texts = {"sharded step (jit_forward over the mesh)": steps[n]}
        texts.update({f"engine {key}": program.as_text() for key, program in sorted(programs.compiled.items())})
        for program, text in texts.items():
            c = collectives(text)
            rows.append({"N": n, "program": program, **{where: format_counts(ops) for where, ops in c.items()}})
    return rows


# ------------------------------------------------------------------------------------------ (c) step time
def step_batches() -> dict:
    """A decode step (8 sequences of 128 cached tokens) and a prefill step (one 128-token prompt)."""
    blocks = [list(range(1 + 9 * s, 10 + 9 * s)) for s in range(8)]  # 9 blocks of 16: 144 tokens per sequence
    decode = [SequenceChunk([5 + s], 128, blocks[s]) for s in range(8)]
    prefill = [SequenceChunk(list(range(3, 131)), 0, blocks[0])]
    return {name: jax.tree.map(jnp.asarray, build_step_batch(chunks, BLOCK_SIZE, max_blocks=9))
            for name, chunks in (("decode 8 x 1 token", decode), ("prefill 1 x 128 tokens", prefill))}


def median_ms(step, params, kv, batch, iters: int) -> tuple[float, object]:
    """Median of `iters` donated steps (the pool threads through, as in the engine) after two warm-up runs."""
    times = []
    for i in range(iters + 2):
        start = time.perf_counter()
        logits, kv = step(params, kv, batch)
        logits.block_until_ready()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, kv


def step_time_rows(params, iters: int) -> tuple[list[dict], dict]:
    """Rows of step times, and the compiled HLO of each N's sharded step (for (b))."""
    batches = step_batches()
    num_blocks = 1 + 9 * 8
    rows, hlo = [], {}
    kv = init_kv_cache(SMALL, num_blocks, BLOCK_SIZE)
    row = {"N": "unsharded"}
    for name, batch in batches.items():
        row[f"{name} (ms)"], kv = median_ms(jit_forward(SMALL), params, kv, batch, iters)
    rows.append(row)
    for n in SIZES:
        mesh = tp.make_mesh(n)
        placed = tp.shard_params(params, SMALL, mesh)
        kv = tp.init_kv_cache(SMALL, num_blocks, BLOCK_SIZE, mesh=mesh)
        step = tp.jit_forward(SMALL, REFERENCE, mesh=mesh)
        hlo[n] = step.lower(placed, kv, batches["decode 8 x 1 token"]).compile().as_text()
        row = {"N": n}
        for name, batch in batches.items():
            row[f"{name} (ms)"], kv = median_ms(step, placed, kv, batch, iters)
        rows.append(row)
    return rows, hlo


# ------------------------------------------------------------------------------------------ (d) on paper
def paper_rows(name: str = "Llama-3-70B", n: int = 8) -> list[dict]:
    """A decode token's all-reduce traffic over NVLink against the step's weight read, per GPU."""
    config = LLAMA3[name]
    num_all_reduces = 2 * config.num_layers
    params = abstract_params(config, jnp.bfloat16)
    embed_bytes = params.embed.size * 2  # a step reads B rows of it, not the table
    weight_read_s = (per_device_bytes(params, config, n)["total"] - embed_bytes) / HBM_BYTES_PER_S
    rows = []
    for dtype, itemsize in (("bfloat16", 2), ("float32 (what _all_reduce sums in)", 4)):
        message = config.hidden_size * itemsize  # one token's [H] row
        sent = 2 * (n - 1) / n * message  # ring all-reduce, per device
        per_token = num_all_reduces * sent
        per_token_s = per_token / NVLINK_BYTES_PER_S
        rows.append({"all-reduce dtype": dtype, "message per token (B)": message,
                     "sent per device per all-reduce (B)": round(sent), "all-reduces per token": num_all_reduces,
                     "per token (MB)": per_token / 1e6, "NVLink time per token (us)": per_token_s * 1e6,
                     "weight read per step (ms)": weight_read_s * 1e3,
                     "batch where NVLink time = weight read": round(weight_read_s / per_token_s),
                     f"latency per step at {ALL_REDUCE_LATENCY_S * 1e6:.0f} us each (ms)":
                         num_all_reduces * ALL_REDUCE_LATENCY_S * 1e3})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20, help="timed steps per measurement in (c)")
    args = parser.parse_args()
    start = time.perf_counter()
    params = random_params(SMALL, jax.random.key(0), scale=0.05)
    print(f"small model: {SMALL.num_layers} layers, hidden {SMALL.hidden_size}, {SMALL.num_heads} query and "
          f"{SMALL.num_kv_heads} KV heads of {SMALL.head_dim}, MLP {SMALL.intermediate_size}, vocabulary "
          f"{SMALL.vocab_size}, float32; {len(jax.devices())} fake CPU devices\n")
    print("(a) bytes on one device, small model (KV pool: 1,024 tokens)\n")
    print(format_table(small_model_bytes(params)) + "\n")
    print("(a) bytes on one device, Llama-3 shapes, bfloat16, computed from abstract shapes\n")
    print(format_table(llama3_bytes()) + "\n")
    times, hlo = step_time_rows(params, args.iters)
    print("(b) collectives in the compiled HLO, small model\n")
    print(format_table(collective_rows(params, hlo)) + "\n")
    print("(c) step time on fake CPU devices (they share this machine's cores: for the record only)\n")
    print(format_table(times) + "\n")
    print(f"(d) on paper: Llama-3-70B, N = 8, H200 (NVLink {NVLINK_BYTES_PER_S / 1e9:.0f} GB/s each way, HBM "
          f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s); ring all-reduce sends 2 (N-1)/N x message per device\n")
    print(format_table(paper_rows()) + "\n")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
