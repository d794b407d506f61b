"""Tensor parallelism of the forward (jaxllm/model/tensor_parallel.py): equal logits at N = 1, 2, 4, 8 on the test
process's fake CPU devices (tests/conftest.py), with the reference attention and with the Pallas kernels in interpret
mode under shard_map; the sharded step and the engine's programs over a mesh lowered for CUDA with the Triton kernels;
the shard-major layout, per-device bytes, two all-reduces per layer, and clear errors for sizes that cannot split the
model."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.engine.bucketing import Buckets
from jaxllm.engine.step_programs import StepPrograms
from jaxllm.model import (Kernels, SequenceChunk, StepBatch, build_step_batch, init_kv_cache, jit_forward,
                          random_params, select_kernels)
from jaxllm.model import tensor_parallel as tp
from tests.cuda_lowering import count_per_step, lower_for_cuda

LOGITS_TOLERANCE = 1e-5  # float32: only the order of the sums over devices differs
# interpret mode costs ~5 s per sharded run: KV heads replicated (kv1) at N = 1, 2, 8 and split (kv2) at N = 2
PALLAS_RUNS = ("kv1/tp1", "kv1/tp2", "kv1/tp8", "kv2-bias-tied/tp2")


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


def forward_report(attention: str, only=()) -> dict:
    """{"CASE/tpN": sharded_case's row} for every case and size (or only the CASE/tpN runs in `only`): max_abs_diff
    of the logits over the steps against the single-device forward, param_bytes and kv_bytes on one device,
    all_reduce count in the compiled step."""
    results = {}
    for name, (cfg, sizes) in CASES.items():
        sizes = [n for n in sizes if not only or f"{name}/tp{n}" in only]
        if not sizes:
            continue
        params = random_params(cfg, jax.random.key(0), scale=0.1)
        want = run(jit_forward(cfg, select_kernels(attention)), params, init_kv_cache(cfg, NUM_BLOCKS, BLOCK_SIZE),
                   attention)
        for n in sizes:
            results[f"{name}/tp{n}"] = sharded_case(cfg, params, n, attention, want)
    return results


# The kernels are chosen as on a GPU (compiled Pallas, not interpret mode), although the backend here is the CPU:
# otherwise the interpreter's plain HLO would be lowered instead of the Triton kernels. A mesh of CPU devices lowers
# for CUDA: the module names devices by mesh position only (tests/cuda_lowering.py).
PALLAS = Kernels(attention="pallas", awq_matmul="pallas", lora_matmul="pallas")

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


def lowering_report() -> dict:
    """{"PROGRAM/CASE/tpN": {"triton": Triton kernel calls, "all_reduce": all-reduces, "kernel_operands": the operand
    types of each Triton call, "chars": length of the StableHLO text}}."""
    return {**forward_runs(), **program_runs()}


@pytest.fixture(scope="module")
def worker_report() -> dict:
    return forward_report("reference")


def all_reduces(num_layers: int, tp: int) -> int:
    """All-reduces in a step over tp devices: two a layer (after wo, after w_down); none on one device, whose
    outputs are already whole."""
    return 2 * num_layers if tp > 1 else 0


def devices_of(name: str) -> int:
    """N of a report's key "[PROGRAM/]CASE/tpN"."""
    return int(name.rsplit("/tp", 1)[1])


@pytest.fixture(scope="module", name="lowering_report")
def lowering_report_fixture() -> dict:
    return lowering_report()


@pytest.mark.slow
def test_sharded_logits_equal_one_device(worker_report):
    assert set(worker_report) == {f"{case}/tp{n}" for case, (_, sizes) in CASES.items() for n in sizes}
    diffs = {name: row["max_abs_diff"] for name, row in worker_report.items()}
    assert max(diffs.values()) < LOGITS_TOLERANCE, diffs


@pytest.mark.slow
def test_sharded_logits_equal_one_device_with_pallas_kernels_in_interpret_mode():
    """The ragged kernel (mixed steps) and the split-KV kernel (a decode-only step) on each device's heads."""
    report = forward_report("pallas", only=PALLAS_RUNS)
    assert set(report) == set(PALLAS_RUNS)
    diffs = {name: row["max_abs_diff"] for name, row in report.items()}
    assert max(diffs.values()) < LOGITS_TOLERANCE, diffs
    assert all(row["all_reduce"] == all_reduces(CASES[name.split("/")[0]][0].num_layers, devices_of(name))
               for name, row in report.items()), report


@pytest.mark.slow
def test_sharded_step_lowers_for_cuda_with_the_triton_kernels_on_local_shapes(lowering_report):
    """One Triton call per layer, traced on the device's share: its query heads and its part of the pool; each
    layer's two all-reduces around it."""
    forwards = {name: row for name, row in lowering_report.items() if name.startswith("forward-")}
    assert len(forwards) == 8, sorted(lowering_report)
    for name, row in forwards.items():
        case, n = name.split("/")[1], int(name.split("/tp")[1])
        cfg = CASES[case][0]
        hq, hkv = cfg.num_heads // n, tp.kv_heads_per_device(cfg, n)
        assert (row["triton"], row["all_reduce"]) == (cfg.num_layers, all_reduces(cfg.num_layers, n)), (name, row)
        q = f"tensor<{SIZES['num_tokens']}x{hq}x{cfg.head_dim}xf32>"  # [T, Hq/N, D]
        pool = f"tensor<{cfg.num_layers}x{NUM_BLOCKS}x{hkv}x{BLOCK_SIZE}x{cfg.head_dim}xf32>"  # [L, NB, Hkv/N, B, D]
        assert {q, pool} <= set(row["kernel_operands"][0]), (name, row["kernel_operands"])


@pytest.mark.slow
def test_engine_step_programs_over_a_mesh_lower_for_cuda(lowering_report):
    """Every program of the engine's bucket set (StepPrograms with a mesh): forwards with a Triton kernel and two
    all-reduces, the sampler and prompt logprobs on the vocabulary-split LM head, the logit-state write."""
    programs = {name: row for name, row in lowering_report.items() if not name.startswith("forward-")}
    assert len(programs) == 33, sorted(programs)  # 11 programs x (kv8 at N = 1; kv1, kv8 at 2)
    layers = CASES["kv8"][0].num_layers
    assert all(CASES[case][0].num_layers == layers for case in CASES)
    for name, row in programs.items():
        want = (layers, all_reduces(layers, devices_of(name))) if name.startswith("forward") else (0, 0)
        assert (row["triton"], row["all_reduce"]) == want, (name, row)


@pytest.mark.slow
def test_each_device_holds_its_share_and_a_layer_all_reduces_twice(worker_report):
    layout = {n: worker_report[f"kv8/tp{n}"] for n in (1, 2, 4, 8)}
    cfg = CASES["kv8"][0]
    replicated = 4 * (cfg.vocab_size * cfg.hidden_size + cfg.hidden_size * (1 + 2 * cfg.num_layers))  # embed, norms
    for n, row in layout.items():
        split = (layout[1]["param_bytes"] - replicated) / n
        assert row["param_bytes"] == pytest.approx(replicated + split, rel=0.01), (n, row)
        assert row["kv_bytes"] == layout[1]["kv_bytes"] // n
        assert row["all_reduce"] == all_reduces(cfg.num_layers, n)  # two per layer, none elsewhere


def test_shard_major_layout_gives_each_device_its_heads():
    cfg = config(2, qkv_bias=True)
    params = random_params(cfg, jax.random.key(1))
    assert jax.tree.all(jax.tree.map(jnp.array_equal, tp.shard_major_params(params, cfg, 1).layers, params.layers))
    d, rows = cfg.head_dim, np.asarray(params.layers[0].w_qkv)
    q, k, v = rows[:8 * d], rows[8 * d:10 * d], rows[10 * d:]
    laid_out = np.asarray(tp.shard_major_params(params, cfg, 4).layers[0].w_qkv).reshape(4, 4 * d, -1)
    for s in range(4):  # 2 query heads and (KV heads replicated) KV head s // 2 per device
        expected = np.concatenate([q[2 * s * d:(2 * s + 2) * d], k[(s // 2) * d:(s // 2 + 1) * d],
                                   v[(s // 2) * d:(s // 2 + 1) * d]])
        np.testing.assert_array_equal(laid_out[s], expected)


@pytest.mark.parametrize("tp_size, message", [
    (3, "tensor_parallel_size 3 does not split this model's 8 query heads, 2 KV heads and MLP width 128 evenly; "
        "valid sizes: 1, 2, 4, 8"),
    (16, "tensor_parallel_size 16 asks for more devices than the 8 there are"),
    (0, "tensor_parallel_size must be an int >= 1, got 0"),
])
def test_sizes_that_cannot_work_are_refused(tp_size, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        tp.check_tp_size(config(2), tp_size, num_devices=8)
