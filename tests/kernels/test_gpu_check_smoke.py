"""The GPU check script runs end to end on a CPU (--cpu-smoke: tiny shapes, interpret mode), reporting every section."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_check_cpu_smoke(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu_check.py"), "--cpu-smoke"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(results) == ["environment", "correctness", "kernels", "end_to_end", "engine", "awq", "lora",
                             "tuning"]
    for name, section in results.items():
        assert section["status"] == "ok" and section["rows"], name
    assert all(row["ok"] for row in results["correctness"]["rows"])
    assert {row["impl"] for row in results["kernels"]["rows"]} == {"reference", "ragged", "split_kv", "xla_scatter"}
    assert {row["attention"] for row in results["end_to_end"]["rows"]} == {"pallas", "reference"}
    assert [row["compiles_after_warmup"] for row in results["engine"]["rows"]] == [0, 0, 0, 0]
    assert [row["tensor_parallel_size"] for row in results["engine"]["rows"]] == [None, None, 1, None]
    assert [row["weights"] for row in results["engine"]["rows"]] == ["bf16", "bf16", "bf16", "awq"]
    lora = results["lora"]["rows"]
    kernel_rows = [row for row in lora if row.get("impl") == "lora_kernel" or row["kind"] == "tuning"]
    assert kernel_rows and all(row["ok"] and row["rel_err"] < 5e-3 and row["us"] > 0 for row in kernel_rows)
    assert {row["impl"] for row in lora if row["kind"] == "delta"} == {"bf16_dense", "xla_reference", "lora_kernel"}
    assert {(row["T"], row["adapters"]) for row in lora if row.get("impl") == "lora_kernel"} == {(1, 1), (20, 1),
                                                                                                (20, 4)}
    assert all(row["x_dense"] > 0 for row in lora if row.get("impl") in ("xla_reference", "lora_kernel"))
    assert [row["knobs"] for row in lora if row["kind"] == "tuning"] == [{"block_m": 16, "split_k": 2}]
    assert "== end_to_end: ok" in proc.stdout
