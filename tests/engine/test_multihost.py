"""Several processes run one model with jax.distributed (CPU devices, gloo collectives): every process gives the
tokens one process alone gives (tests/engine/multihost_worker.py); settings are checked and named."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jaxllm.engine import distributed
from jaxllm.engine.args import EngineArgs
from tests.engine.multihost_cases import ENGINE_ARGS, prompts, sampling_params
from tests.fake_devices import child_environment
from tests.server.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> str:
    return str(tiny_model_dir("llama3")[0])  # 4 query heads, 2 KV heads: split at N = 2, replicated at N = 4


@pytest.fixture(scope="module")
def one_process_tokens(model) -> dict[str, list[int]]:
    from jaxllm.llm import LLM

    outputs = LLM(model, **ENGINE_ARGS).generate(prompts(), sampling_params(), use_tqdm=False)
    return {str(i): output.outputs[0].token_ids for i, output in enumerate(outputs)}


def run_processes(model: str, devices_per_process: int, through_environment: bool) -> list[dict]:
    """Two worker processes joined at a free port; their JSON reports, in process order."""
    address = f"127.0.0.1:{free_port()}"
    procs = []
    for process_id in range(2):
        env = child_environment()  # the worker sets its own device count
        command = [sys.executable, "-m", "tests.engine.multihost_worker", model,
                   "--devices-per-process", str(devices_per_process)]
        settings = {"num_processes": "2", "process_id": str(process_id), "coordinator_address": address}
        if through_environment:
            env.update({distributed.ENVIRONMENT[name]: value for name, value in settings.items()})
        else:
            command += [arg for name, value in settings.items() for arg in (f"--{name.replace('_', '-')}", value)]
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


@pytest.mark.slow
@pytest.mark.parametrize("devices_per_process, through_environment", [(1, False), (2, True)])
def test_two_processes_give_the_tokens_of_one(model, one_process_tokens, devices_per_process, through_environment):
    reports = run_processes(model, devices_per_process, through_environment)
    assert [r["process"] for r in reports] == [0, 1]
    assert all(r["devices"] == 2 * devices_per_process for r in reports)  # the mesh spans both processes
    for report in reports:
        assert report["tokens"] == one_process_tokens  # greedy and seeded sampling alike


@pytest.mark.parametrize("settings, environment, message", [
    (dict(num_processes=2, process_id=2, coordinator_address="h:1"), {},
     r"^process_id must be in \[0, 2\) for 2 processes, got 2$"),
    (dict(num_processes=2, process_id=0), {},
     r"^coordinator_address \(host:port of process 0\) is needed for 2 processes; set --coordinator-address or "
     r"JAXLLM_COORDINATOR_ADDRESS$"),
    (dict(num_processes=2, process_id=1, coordinator_address="nohost"), {},
     r"^coordinator_address must be host:port, got 'nohost'$"),
    ({}, {"JAXLLM_NUM_PROCESSES": "two"}, r"^JAXLLM_NUM_PROCESSES must be an integer, got 'two'$"),
    (dict(num_processes=0), {}, r"^num_processes must be >= 1, got 0$"),
])
def test_bad_settings_are_named(settings, environment, message, monkeypatch):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        EngineArgs(**settings).process_group()


def test_settings_come_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("JAXLLM_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAXLLM_PROCESS_ID", "3")
    monkeypatch.setenv("JAXLLM_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    assert EngineArgs().process_group() == distributed.ProcessGroup(4, 3, "10.0.0.1:1234")
    assert EngineArgs(process_id=1).process_group().process_id == 1  # a given setting wins


def test_one_process_changes_nothing():
    group = distributed.ProcessGroup()
    distributed.initialize(group)  # a no-op: JAX already runs in this process
    assert distributed.tensor_parallel_size(None, group) is None
    assert distributed.tensor_parallel_size(2, group) == 2
    # a group's size is checked against every device of its processes: in a process with one device (this one has
    # the suite's fake devices)
    check = ("from jaxllm.engine import distributed\n"
             "try:\n"
             "    distributed.tensor_parallel_size(3, distributed.ProcessGroup(2, 0, 'h:1'))\n"
             "except ValueError as e:\n"
             "    print(e)\n")
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env=child_environment())
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.match(r"^tensor_parallel_size 3: 2 processes split the model over all their 1 devices; set it to 1 or "
                    r"leave it unset$", result.stdout.strip()), result.stdout


def test_the_settings_are_flags():
    from jaxllm.entrypoints.cli import build_parser

    for command in (["serve"], ["generate", "hi"]):
        args = build_parser().parse_args([*command, "--num-processes", "2", "--process-id", "1",
                                          "--coordinator-address", "10.0.0.1:1234"])
        assert (args.num_processes, args.process_id, args.coordinator_address) == (2, 1, "10.0.0.1:1234")


def test_a_coordinator_port_in_use_is_named_before_joining():
    """JAX's coordinator would crash process 0 (SIGSEGV) on a taken port: it is checked and named first."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        group = distributed.ProcessGroup(num_processes=2, process_id=0, coordinator_address=f"127.0.0.1:{port}")
        with pytest.raises(ValueError, match=rf"coordinator_address 127.0.0.1:{port}: port {port} is already in use"):
            distributed.initialize(group)
