"""The GPU check script runs end to end on a CPU (--cpu-smoke: tiny shapes, interpret mode), without the packages
the lent GPU machines lack (gguf, fastapi, uvicorn, starlette: blocked), reporting every section as it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.blocked_packages import REPO, blocking_prelude, run_blocked
from tests.fake_devices import child_environment

pytestmark = pytest.mark.slow  # each test runs benchmarks/gpu_check.py on the CPU (~10 s to ~2 min)

SCRIPT = os.path.join(REPO, "benchmarks", "gpu_check.py")
SECTIONS = ["environment", "goal_decode_bf16", "goal_int4", "goal_engine", "correctness", "kernels", "awq", "lora",
            "moe", "tuning"]
RUN_SCRIPT = f"import runpy\nsys.argv = [{SCRIPT!r}] + {{argv!r}}\nrunpy.run_path({SCRIPT!r}, run_name='__main__')\n"
TIMEOUT_S = 600  # about a minute alone on 2 CPU cores; the margin is for a machine busy with other work


def smoke(tmp_path, *argv: str, **kwargs):
    env = child_environment(OUT=str(tmp_path))
    return run_blocked(RUN_SCRIPT.format(argv=["--cpu-smoke", *argv]), cwd=tmp_path, env=env, **kwargs)


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines() if line.startswith("GPU_CHECK_JSON ")]


def test_gpu_check_cpu_smoke(tmp_path):
    proc = smoke(tmp_path, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(results) == SECTIONS
    for name, section in results.items():
        assert section["status"] == "ok" and section["rows"], name
    # one line per section, printed and in the jsonl file, each the section's whole result
    jsonl = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    assert [line["section"] for line in jsonl] == SECTIONS == [line["section"] for line in json_lines(proc.stdout)]
    assert all(line["rows"] == results[line["section"]]["rows"] for line in jsonl)
    assert [line["elapsed_s"] for line in jsonl] == sorted(line["elapsed_s"] for line in jsonl)

    assert "--xla_gpu_autotune_level=0" in results["environment"]["rows"][0]["xla_flags"]
    bf16 = [row for row in results["goal_decode_bf16"]["rows"] if row.get("kind") != "params"]
    assert [row["context"] for row in bf16] == [24, 40]
    for row in bf16:
        assert row["step_ms"] > 0 and row["compile_s"] > 0 and 0 < row["%roofline"] < 100, row
        # tiny model: 2 layers x 2 KV heads x 32 dims x K and V x 2 bytes per token
        assert row["kv_GB"] * 1e9 == row["context"] * 2 * 2 * 32 * 2 * 2
    int4 = [row for row in results["goal_int4"]["rows"] if row.get("kind") != "params"]
    assert [(row["scales"], row["context"]) for row in int4] == [("bfloat16", 24), ("bfloat16", 40), ("float16", 24)]
    assert all(row["speedup_vs_bf16"] > 0 and row["weight_GB"] < bf16[0]["weight_GB"] for row in int4)
    engine, = results["goal_engine"]["rows"]
    # the workload's shape keeps the program set at three: prefill wave, decode wave, sampler
    assert engine["programs"] == 3 and len(engine["program_compile_s"]) == 3, engine
    assert engine["compiles_after_warmup"] == 0 and engine["output_tokens"] == 8 * 4 and engine["ok"], engine

    assert all(row["ok"] for row in results["correctness"]["rows"])
    assert {row["impl"] for row in results["kernels"]["rows"]} == {"reference", "ragged", "split_kv", "xla_scatter"}
    awq = [row for row in results["awq"]["rows"] if row.get("impl") == "awq_kernel"]
    assert {row["scales"] for row in awq} == {"bfloat16", "float16"} and all(row["ok"] for row in awq)
    lora = results["lora"]["rows"]
    kernel_rows = [row for row in lora if row.get("impl") == "lora_kernel" or row["kind"] == "tuning"]
    assert kernel_rows and all(row["ok"] and row["rel_err"] < 5e-3 and row["us"] > 0 for row in kernel_rows)
    assert {row["impl"] for row in lora if row["kind"] == "delta"} == {"bf16_dense", "xla_reference", "lora_kernel"}
    assert {(row["T"], row["adapters"]) for row in lora if row.get("impl") == "lora_kernel"} == {(1, 1), (20, 1),
                                                                                                (20, 4)}
    assert all(row["x_dense"] > 0 for row in lora if row.get("impl") in ("xla_reference", "lora_kernel"))
    moe = results["moe"]["rows"]
    assert [(row["T"], row["impl"]) for row in moe] == [(t, impl) for t in (1, 12)
                                                        for impl in ("bf16_dense_active", "pallas", "xla_reference")]
    assert all(row["us"] > 0 for row in moe) and all(row["ok"] for row in moe if row["impl"] == "pallas")
    assert all(row["x_dense"] > 0 and 1 <= row["experts_touched"] <= 8 for row in moe
               if row["impl"] != "bf16_dense_active")
    tuning = results["tuning"]["rows"]
    assert [row["kind"] for row in tuning] == ["compile_options", "attention_knobs"]
    assert tuning[0]["options"]["xla_gpu_autotune_level"] == 4 and tuning[0]["step_ms"] > 0
    assert "== goal_engine: ok" in proc.stdout


def test_gpu_check_keeps_its_budget(tmp_path):
    """With a budget already spent at start-up, no section starts a measurement; every section still reports."""
    proc = smoke(tmp_path, "--budget-s", "0.5", timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = json_lines(proc.stdout)
    assert [line["section"] for line in lines] == SECTIONS
    assert lines[0]["rows"] and all(line["status"] == "ok" and line["rows"] == [] for line in lines[1:]), lines


def test_gpu_check_killed_keeps_the_finished_sections(tmp_path):
    """SIGTERM (what `timeout` sends) after the first goal: its line is on disk, and the section it interrupted
    reports what it had."""
    env = child_environment(OUT=str(tmp_path), PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    code = blocking_prelude() + RUN_SCRIPT.format(argv=["--cpu-smoke"])
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    stdout, deadline = [], time.time() + TIMEOUT_S
    try:
        for line in proc.stdout:
            stdout.append(line)
            if line.startswith("GPU_CHECK_JSON ") and '"section": "goal_decode_bf16"' in line:
                proc.send_signal(signal.SIGTERM)
                break
            assert time.time() < deadline, "".join(stdout)[-3000:]
        stdout += proc.stdout.readlines()
        assert proc.wait(timeout=TIMEOUT_S) == 1, "".join(stdout)[-3000:]
    finally:
        proc.kill()
    jsonl = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    sections = [line["section"] for line in jsonl]
    # goal_int4 was running, unless the signal came before it began (then the run stops before starting it)
    assert sections in (SECTIONS[:2], SECTIONS[:3]), stdout[-20:]
    assert [line["status"] for line in jsonl] == ["ok", "ok", "terminated"][:len(jsonl)]
    assert jsonl[1]["rows"] and all("step_ms" in row for row in jsonl[1]["rows"] if row.get("kind") != "params")
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(results) == sections
