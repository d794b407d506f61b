"""The engine with tensor_parallel_size N (fake CPU devices, in a subprocess: tests/engine/tp_engine_worker.py) gives
the unsharded engine's greedy tokens, through chunked prefill, prefix-cache hits and preemption; the default model
at N = 3 too, and N = 2 is refused for it (9 query heads). An AWQ int4 model (packed weights split with their
groups) at N = 2 and 4 equals N = 1; a size that would split a quantization group is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxllm.engine.args import EngineArgs

REPO = Path(__file__).resolve().parents[2]
# variant -> the sizes it runs at, every architecture: Llama 3 KV heads 2 split (N = 2) and replicated (N = 4);
# Llama 2 MHA split to one KV head per device; Mistral's one KV head replicated; q/k/v bias with tied embeddings
# (Qwen2). (Every KV-head ratio at N = 1, 2, 4, 8 is covered at the model
# level, tests/model/test_tensor_parallel.py.)
VARIANTS = {"llama3": (2, 4), "llama2": (4,), "mistral": (4,), "qwen2": (2,)}


AWQ_SIZES = (2, 4)  # group size 16: o_proj's 64 input rows are 4 groups, one per device at N = 4


@pytest.fixture(scope="module")
def report(tiny_model_dir, awq_model_dir) -> dict:
    models = [f"{tiny_model_dir(v)[0]}={','.join(map(str, sizes))}" for v, sizes in VARIANTS.items()]
    models.append(f"{awq_model_dir('llama3')}={','.join(map(str, AWQ_SIZES))}")
    straddled = f"{awq_model_dir('llama3', group_size=32)}=4"  # o_proj's 2 groups of 32 over 4 devices
    result = subprocess.run([sys.executable, "-m", "tests.engine.tp_engine_worker", *models, "--default-model",
                             "--refused", straddled],
                            cwd=REPO, capture_output=True, text=True, timeout=1200,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_sharded_engine_gives_the_unsharded_tokens(report, tiny_model_dir, awq_model_dir):
    runs = {name: row for name, row in report.items() if name != "refused"}
    expected = {f"{Path(tiny_model_dir(v)[0]).name}/tp{n}" for v, sizes in VARIANTS.items() for n in sizes}
    expected |= {f"{awq_model_dir('llama3').name}/tp{n}" for n in AWQ_SIZES}
    assert set(runs) == expected | {"default/tp3"}
    assert all(row["equal"] for row in runs.values()), runs
    tiny = [row for name, row in runs.items() if not name.startswith("default")]
    assert all(row["preempted"] > 0 and row["prefix_hits"] > 0 for row in tiny), tiny  # the workload did both


@pytest.mark.slow
def test_a_size_that_cannot_split_the_default_model_is_refused(report):
    assert report["refused"]["default/tp2"] == (
        "tensor_parallel_size 2 does not split this model's 9 query heads, 3 KV heads and MLP width 1536 evenly; "
        "valid sizes: 1, 3")


@pytest.mark.slow
def test_a_size_that_would_split_a_quantization_group_is_refused(report, awq_model_dir):
    name = awq_model_dir("llama3", group_size=32).name
    assert report["refused"][f"{name}/tp4"] == (
        "tensor_parallel_size 4 cannot split .layers[0].wo.zeros (2, 64): an axis of 2 does not divide into 4 "
        "equal parts (a packed int4 weight's groups of rows must not straddle two devices: choose another size, "
        "or quantize with a smaller group size)")


def test_tensor_parallel_size_is_an_engine_argument_and_a_flag():
    from jaxllm.entrypoints.cli import build_parser

    assert EngineArgs().tensor_parallel_size is None
    for command in (["serve"], ["generate", "hi"]):
        assert build_parser().parse_args([*command, "--tensor-parallel-size", "2"]).tensor_parallel_size == 2
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1, got 0"):
        EngineArgs(tensor_parallel_size=0)
