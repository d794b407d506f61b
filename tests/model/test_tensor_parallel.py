"""Tensor parallelism of the forward (jaxllm/model/tensor_parallel.py): equal logits at N = 1, 2, 4, 8 on fake CPU
devices (a subprocess: the device count is fixed when JAX starts), the shard-major layout, per-device bytes, two
all-reduces per layer, and clear errors for sizes that cannot split the model."""

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
from tests.model.tp_worker import CASES, config

REPO = Path(__file__).resolve().parents[2]
LOGITS_TOLERANCE = 1e-5  # float32: only the order of the sums over devices differs


@pytest.fixture(scope="module")
def worker_report() -> dict:
    result = subprocess.run([sys.executable, "-m", "tests.model.tp_worker"], cwd=REPO, capture_output=True,
                            text=True, timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_sharded_logits_equal_one_device(worker_report):
    assert set(worker_report) == {f"{case}/tp{n}" for case, (_, sizes) in CASES.items() for n in sizes}
    diffs = {name: row["max_abs_diff"] for name, row in worker_report.items()}
    assert max(diffs.values()) < LOGITS_TOLERANCE, diffs


def test_each_device_holds_its_share_and_a_layer_all_reduces_twice(worker_report):
    layout = {n: worker_report[f"kv8/tp{n}"] for n in (1, 2, 4, 8)}
    cfg = CASES["kv8"][0]
    replicated = 4 * (cfg.vocab_size * cfg.hidden_size + cfg.hidden_size * (1 + 2 * cfg.num_layers))  # embed, norms
    for n, row in layout.items():
        split = (layout[1]["param_bytes"] - replicated) / n
        assert row["param_bytes"] == pytest.approx(replicated + split, rel=0.01), (n, row)
        assert row["kv_bytes"] == layout[1]["kv_bytes"] // n
        assert row["all_reduce"] == 2  # both in the scanned layer body: two per layer, none elsewhere


def test_shard_major_layout_gives_each_device_its_heads():
    cfg = config(2, qkv_bias=True)
    params = random_params(cfg, jax.random.key(1))
    assert jax.tree.all(jax.tree.map(jnp.array_equal, tp.shard_major_params(params, cfg, 1).layers, params.layers))
    d, rows = cfg.head_dim, np.asarray(params.layers.w_qkv[0])
    q, k, v = rows[:8 * d], rows[8 * d:10 * d], rows[10 * d:]
    laid_out = np.asarray(tp.shard_major_params(params, cfg, 4).layers.w_qkv[0]).reshape(4, 4 * d, -1)
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
