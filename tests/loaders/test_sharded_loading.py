"""Loading a model split over N devices places each device's part straight from the host: device 0 never holds more
than its own share (about 1/N of the model, plus the replicated embedding and norms), where loading it whole first
held the whole model there. Safetensors, GGUF and orbax sources, at N = 4 (and 2), on fake CPU devices in a
subprocess (sharded_load_worker.py); the values equal the previous path's bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxllm.loaders import load_model, save_checkpoint
from tests.tiny_models import write_gguf

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tiny_model_dir, tmp_path_factory) -> dict:
    directory, hf_model = tiny_model_dir("llama2")  # 4 query and 4 KV heads: N = 4 splits every head axis evenly
    tmp = tmp_path_factory.mktemp("sharded-loading")
    gguf = write_gguf(hf_model, tmp / "model.gguf")
    bf16 = load_model(directory, dtype="bfloat16")
    checkpoint = save_checkpoint(tmp / "checkpoint", bf16.config, bf16.params)
    cases = [f"hf={directory}=2,4", f"gguf={gguf}=4", f"orbax-bf16={checkpoint}=4"]
    result = subprocess.run([sys.executable, "-m", "tests.loaders.sharded_load_worker", *cases], cwd=REPO,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_device_0_holds_at_most_its_share_while_loading(report):
    assert set(report) == {"hf/tp2", "hf/tp4", "gguf/tp4", "orbax-bf16/tp4"}
    for name, row in report.items():
        n = int(name.rsplit("tp", 1)[1])
        assert row["laid_out"] == row["whole"], row  # no head is replicated, the vocabulary splits evenly
        assert row["share"] == row["replicated"] + (row["whole"] - row["replicated"]) // n, (name, row)
        assert row["peak"] == row["share"], (name, row)
        assert row["previous_peak"] > row["whole"], (name, row)  # loaded whole, then split: the gauge sees it
    quarter = report["hf/tp4"]
    assert quarter["peak"] < 0.4 * quarter["whole"], quarter


def test_sharded_values_equal_the_previous_path(report):
    assert all(row["equal"] for row in report.values()), report
