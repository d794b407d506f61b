"""LoRA under tensor parallelism (fake CPU devices, in a subprocess: tests/lora/tp_lora_worker.py): B split with
the column-parallel base rows (q|k|v, gate|up, laid out shard-major like them), A with the row-parallel base
columns (o, down); the engine at N = 2 and 4 gives the unsharded engine's greedy tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sharded_lora_engine_gives_the_unsharded_tokens(tiny_model_dir, peft_adapter):
    directory, _ = tiny_model_dir("llama3")  # KV heads 2: split at N = 2, replicated at N = 4
    adapters = [str(peft_adapter("llama3", f"tp{i}", rank=rank)[0]) for i, rank in enumerate((8, 4, 2))]
    result = subprocess.run([sys.executable, "-m", "tests.lora.tp_lora_worker", str(directory), *adapters,
                             "--sizes", "2,4"], cwd=REPO, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report) == {"tp2", "tp4"}
    assert all(row["equal"] for row in report.values()), report


def test_slot_shardings_follow_the_base_weights():
    from jaxllm.lora.device_slots import slot_shardings
    from jaxllm.model.tensor_parallel import make_mesh

    per_layer = slot_shardings(make_mesh(1), num_layers=3)
    assert len(per_layer) == 3
    specs = {field: (tuple(a.spec), tuple(b.spec)) for field, (a, b) in per_layer[2].items()}
    assert specs["w_qkv"] == ((None, None, None), (None, "tp", None))  # b over q|k|v rows
    assert specs["w_gate_up"] == ((None, None, None), (None, "tp", None))
    assert specs["wo"] == ((None, None, "tp"), (None, None, None))  # a over o's input columns
    assert specs["w_down"] == ((None, None, "tp"), (None, None, None))
