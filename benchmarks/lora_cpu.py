"""Multi-LoRA overhead on the CPU path: decode step time at batch 64 (256 cached tokens, the default model,
float32) without LoRA vs with LoRA slots holding 0, 1 and 4 distinct adapters (rank 16, every module, 4 slots);
then the time to read a PEFT adapter from disk and to write it into a device slot (a swap).

    python benchmarks/lora_cpu.py [--repeats 5]

Step times are medians of interleaved rounds (every variant sees the same machine state); the ratio is to the
step without LoRA. The adapters are random (their values do not change the time), written as PEFT directories.
Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxllm.loaders import load_model  # noqa: E402
from jaxllm.lora import device_slots  # noqa: E402
from jaxllm.lora.peft import load_peft_adapter, module_shapes  # noqa: E402
from jaxllm.model import SequenceChunk, build_step_batch, forward, init_kv_cache, lora_weight  # noqa: E402

BLOCK, CONTEXT, BATCH, RANK, SLOTS = 16, 256, 64, 16, 4


def write_peft_adapter(directory: str, config, seed: int) -> str:
    """A random rank-16 PEFT adapter of every module (safetensors + adapter_config.json)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for module, (out, k) in module_shapes(config).items():
            group = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.02, (RANK, k)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.02, (out, RANK)).astype(np.float32)
    os.makedirs(directory)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": RANK, "lora_alpha": 32, "target_modules": list(module_shapes(config))},
                  f)
    return directory


def step_times(config, params, slots, repeats: int) -> list[dict]:
    blocks = CONTEXT // BLOCK
    chunks = [SequenceChunk([7], CONTEXT - 1, list(range(1 + i * blocks, 1 + (i + 1) * blocks))) for i in range(BATCH)]
    batch = build_step_batch(chunks, BLOCK)
    token_slots = {"lora_0_adapters": np.zeros(BATCH, np.int32), "lora_1_adapter": np.ones(BATCH, np.int32),
                   "lora_4_adapters": np.arange(BATCH, dtype=np.int32) % SLOTS + 1}

    def plain(params, slots, kv, batch):
        return forward(params, kv, batch, config=config)

    def with_lora(params, slots, kv, batch):
        return forward(lora_weight.attach(params, slots, batch.lora_slots), kv, batch, config=config)

    programs = {"no_lora": jax.jit(plain, donate_argnums=(2,)), "lora": jax.jit(with_lora, donate_argnums=(2,))}
    variants = {"no_lora": batch, **{name: batch.replace(lora_slots=s) for name, s in token_slots.items()}}
    caches = {v: init_kv_cache(config, 1 + BATCH * blocks, BLOCK) for v in variants}
    times = {v: [] for v in variants}
    for round_ in range(repeats + 1):  # round 0 compiles and warms
        for v, b in variants.items():
            program = programs["no_lora" if v == "no_lora" else "lora"]
            start = time.perf_counter()
            logits, caches[v] = program(params, slots, caches[v], b)
            logits.block_until_ready()
            if round_:
                times[v].append(time.perf_counter() - start)
    base = statistics.median(times["no_lora"])
    return [{"variant": v, "step_ms": 1e3 * statistics.median(t), "vs_no_lora": statistics.median(t) / base}
            for v, t in times.items()]


def load_and_swap(config, paths: list[str], slots) -> tuple[dict, object]:
    write = device_slots.slot_writer(None, config.num_layers)
    slots = write(slots, np.int32(1), load_peft_adapter(paths[0], config, RANK, np.float32))  # compile once
    reads, writes = [], []
    for i, path in enumerate(paths):
        start = time.perf_counter()
        adapter = load_peft_adapter(path, config, RANK, np.float32)
        reads.append(time.perf_counter() - start)
        start = time.perf_counter()
        slots = jax.block_until_ready(write(slots, np.int32(i % SLOTS + 1), adapter))
        writes.append(time.perf_counter() - start)
    return {"read_peft_ms": 1e3 * statistics.median(reads), "write_slot_ms": 1e3 * statistics.median(writes)}, slots


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    loaded = load_model(None, dtype="float32")
    config = loaded.config
    slots = device_slots.init_slots(config, SLOTS, RANK, np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_peft_adapter(os.path.join(tmp, f"a{i}"), config, i) for i in range(SLOTS)]
        swap, slots = load_and_swap(config, paths, slots)
    slot_mib = sum(a.nbytes + b.nbytes for a, b in slots.values()) / 2**20
    rows = step_times(config, loaded.params, slots, args.repeats)
    for row in rows + [swap]:
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(f"slots: {SLOTS} x rank {RANK}, {slot_mib:.1f} MiB")
    print(json.dumps({"steps": rows, "swap": swap, "slot_MiB": slot_mib, "backend": jax.default_backend()}))


if __name__ == "__main__":
    main()
