"""Tensor parallelism of the forward (jaxllm/model/tensor_parallel.py): equal logits at N = 1, 2, 4, 8 on fake CPU
devices (subprocesses: the device count is fixed when JAX starts), with the reference attention and with the Pallas
kernels in interpret mode under shard_map; the sharded step and the engine's programs over a mesh lowered for CUDA
with the Triton kernels; the shard-major layout, per-device bytes, two all-reduces per layer, and clear errors for
sizes that cannot split the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.model import random_params
from jaxllm.model import tensor_parallel as tp
from tests.model.tp_worker import BLOCK_SIZE, CASES, NUM_BLOCKS, SIZES, config

REPO = Path(__file__).resolve().parents[2]
LOGITS_TOLERANCE = 1e-5  # float32: only the order of the sums over devices differs
# interpret mode costs ~5 s per sharded run: KV heads replicated (kv1) at N = 1, 2, 8 and split (kv2) at N = 2
PALLAS_RUNS = ("kv1/tp1", "kv1/tp2", "kv1/tp8", "kv2-bias-tied/tp2")


def run_worker(module: str, *args: str) -> dict:
    """The JSON object a worker module prints, run in a subprocess (it sets its own fake device count)."""
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def worker_report() -> dict:
    return run_worker("tests.model.tp_worker")


@pytest.fixture(scope="module")
def lowering_report() -> dict:
    return run_worker("tests.model.tp_lowering_worker")


def test_sharded_logits_equal_one_device(worker_report):
    assert set(worker_report) == {f"{case}/tp{n}" for case, (_, sizes) in CASES.items() for n in sizes}
    diffs = {name: row["max_abs_diff"] for name, row in worker_report.items()}
    assert max(diffs.values()) < LOGITS_TOLERANCE, diffs


def test_sharded_logits_equal_one_device_with_pallas_kernels_in_interpret_mode():
    """The ragged kernel (mixed steps) and the split-KV kernel (a decode-only step) on each device's heads."""
    report = run_worker("tests.model.tp_worker", "--attention", "pallas", "--only", ",".join(PALLAS_RUNS))
    assert set(report) == set(PALLAS_RUNS)
    diffs = {name: row["max_abs_diff"] for name, row in report.items()}
    assert max(diffs.values()) < LOGITS_TOLERANCE, diffs
    assert all(row["all_reduce"] == 2 * CASES[name.split("/")[0]][0].num_layers for name, row in report.items()), report


def test_sharded_step_lowers_for_cuda_with_the_triton_kernels_on_local_shapes(lowering_report):
    """One Triton call per layer, traced on the device's share: its query heads and its part of the pool; each
    layer's two all-reduces around it."""
    forwards = {name: row for name, row in lowering_report.items() if name.startswith("forward-")}
    assert len(forwards) == 8, sorted(lowering_report)
    for name, row in forwards.items():
        case, n = name.split("/")[1], int(name.split("/tp")[1])
        cfg = CASES[case][0]
        hq, hkv = cfg.num_heads // n, tp.kv_heads_per_device(cfg, n)
        assert (row["triton"], row["all_reduce"]) == (cfg.num_layers, 2 * cfg.num_layers), (name, row)
        q = f"tensor<{SIZES['num_tokens']}x{hq}x{cfg.head_dim}xf32>"  # [T, Hq/N, D]
        pool = f"tensor<{cfg.num_layers}x{NUM_BLOCKS}x{hkv}x{BLOCK_SIZE}x{cfg.head_dim}xf32>"  # [L, NB, Hkv/N, B, D]
        assert {q, pool} <= set(row["kernel_operands"][0]), (name, row["kernel_operands"])


def test_engine_step_programs_over_a_mesh_lower_for_cuda(lowering_report):
    """Every program of the engine's bucket set (StepPrograms with a mesh): forwards with a Triton kernel and two
    all-reduces, the sampler and prompt logprobs on the vocabulary-split LM head."""
    programs = {name: row for name, row in lowering_report.items() if not name.startswith("forward-")}
    assert len(programs) == 33, sorted(programs)  # 11 programs x (kv8 at N = 1; kv1, kv8 at 2)
    layers = CASES["kv8"][0].num_layers
    assert all(CASES[case][0].num_layers == layers for case in CASES)
    for name, row in programs.items():
        want = (layers, 2 * layers) if name.startswith("forward") else (0, 0)
        assert (row["triton"], row["all_reduce"]) == want, (name, row)


def test_each_device_holds_its_share_and_a_layer_all_reduces_twice(worker_report):
    layout = {n: worker_report[f"kv8/tp{n}"] for n in (1, 2, 4, 8)}
    cfg = CASES["kv8"][0]
    replicated = 4 * (cfg.vocab_size * cfg.hidden_size + cfg.hidden_size * (1 + 2 * cfg.num_layers))  # embed, norms
    for n, row in layout.items():
        split = (layout[1]["param_bytes"] - replicated) / n
        assert row["param_bytes"] == pytest.approx(replicated + split, rel=0.01), (n, row)
        assert row["kv_bytes"] == layout[1]["kv_bytes"] // n
        assert row["all_reduce"] == 2 * cfg.num_layers  # two per layer, none elsewhere


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
