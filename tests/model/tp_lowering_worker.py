"""Run in a subprocess with 8 fake CPU devices: the tensor-parallel step lowered for CUDA with the Pallas Triton
kernels under shard_map. Prints one JSON object: {"PROGRAM/CASE/tpN": {"triton": Triton kernel calls,
"all_reduce": all-reduces, "kernel_operands": the operand types of each Triton call, "chars": length of the
StableHLO text}}.

    python -m tests.model.tp_lowering_worker

`jit(f).trace(...).lower(lowering_platforms=("cuda",))` runs the whole lowering (shard_map's manual computation
over the mesh, the Pallas -> Triton IR lowering of each kernel on its per-device shapes, the collectives) on a
CPU-only machine; only XLA's GPU compile needs a GPU. A mesh of CPU devices lowers for CUDA: the module names
devices by mesh position only.

The kernels are chosen as on a GPU (PALLAS: compiled Pallas, not interpret mode), although the backend here is the
CPU: otherwise the interpreter's plain HLO would be lowered instead of the Triton kernels.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402

from jaxllm.engine.bucketing import Buckets  # noqa: E402
from jaxllm.engine.step_programs import StepPrograms  # noqa: E402
from jaxllm.model import Kernels, random_params  # noqa: E402
from jaxllm.model import tensor_parallel as tp  # noqa: E402
from tests.cuda_lowering import count_per_step, lower_for_cuda  # noqa: E402
from tests.model.tp_worker import BLOCK_SIZE, CASES, NUM_BLOCKS, SIZES, batches  # noqa: E402

PALLAS = Kernels(attention="pallas", awq_matmul="pallas", lora_matmul="pallas")  # as on a GPU (see above)

FORWARD_RUNS = ("kv1/tp2", "kv1/tp8", "kv8/tp2", "kv8/tp8")  # KV heads replicated 2x and 8x, and split
PROGRAM_RUNS = ("kv8/tp1", "kv1/tp2", "kv8/tp2")  # every program of the engine's bucket set, N = 1 among them
TRITON_CALL = "__gpu$xla.gpu.triton"
# a custom call's line ends with its signature "} : (operand types) -> result type"; greedy .* skips the kernel's
# serialized IR in between
KERNEL_OPERANDS = re.compile(re.escape(TRITON_CALL) + r".*\} : \(([^()]*)\) ->")


def counts(lowered_text: str) -> dict:
    return {"triton": count_per_step(lowered_text, TRITON_CALL),
            "all_reduce": count_per_step(lowered_text, "stablehlo.all_reduce"),
            "kernel_operands": [ops.split(", ") for ops in KERNEL_OPERANDS.findall(lowered_text)],
            "chars": len(lowered_text)}


def sharded_setup(run: str):
    """(config, mesh, params split over it, the split pool) of a run named CASE/tpN."""
    name, size = run.split("/tp")
    cfg = CASES[name][0]
    mesh = tp.make_mesh(int(size))
    params = tp.shard_params(random_params(cfg, jax.random.key(0), scale=0.1), cfg, mesh)
    return cfg, mesh, params, tp.init_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE, mesh=mesh)


def forward_runs() -> dict:
    """jit_forward over the mesh on a mixed step (ragged kernel) and a decode-only step (split-KV kernel)."""
    results = {}
    for run in FORWARD_RUNS:
        cfg, mesh, params, kv = sharded_setup(run)
        forward = tp.jit_forward(cfg, PALLAS, mesh=mesh)
        for batch in (batches("pallas")[0], batches("pallas")[-1]):
            kind = "decode" if batch.decode_only else "mixed"
            results[f"forward-{kind}/{run}"] = counts(lower_for_cuda(forward, params, kv, batch))
    return results


def program_runs() -> dict:
    """Every program the engine would build for this bucket set (step_programs.py) with the mesh."""
    results = {}
    buckets = Buckets(SIZES["num_tokens"], SIZES["num_seqs"], decode_only_programs=True)
    for run in PROGRAM_RUNS:
        cfg, mesh, params, kv = sharded_setup(run)
        programs = StepPrograms(cfg, PALLAS, buckets, SIZES["max_blocks"], mesh)
        for key in buckets.all_programs():
            program = programs.program(key)
            text = lower_for_cuda(program.jitted, *programs.example_args(key, params, kv), **program.static)
            results[f"{key}/{run}"] = counts(text)
    return results


def main() -> None:
    print(json.dumps({**forward_runs(), **program_runs()}))


if __name__ == "__main__":
    main()
