"""Real server subprocesses over a tiny random-weight Llama that uses the default model's tokenizer (so text
prompts, the chat template and the openai client all work) while loading and compiling in seconds."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fake_devices import child_environment

SERVED_NAME = "tiny"
STARTUP_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """The server on a free port, started as `python -m jaxllm.entrypoints.openai.api_server` or, with
    via_cli, as `jaxllm serve`; stdout+stderr go to a log file."""

    def __init__(self, model: Path, log_path: Path, *extra: str, via_cli: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        entry = ["jaxllm.entrypoints.cli", "serve"] if via_cli else ["jaxllm.entrypoints.openai.api_server"]
        cmd = [sys.executable, "-m", *entry, str(model), "--port", str(self.port),
               "--served-model-name", SERVED_NAME, "--log-level", "warning", *extra]
        env = child_environment()  # one CPU device: a process of a group must have its own
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the server did not become healthy in {STARTUP_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:  # stop() closes it
            self._log.flush()
        return self.log_path.read_text()[-4000:]

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def start_server(tiny_model_with_tokenizer, tmp_path_factory):
    """Factory: start_server(*flags, via_cli=False, warmup=False) -> a healthy ServerProcess, stopped at the end
    of the session: for the session's and a package's shared servers. A module's or a test's own servers come
    from start_module_server / start_test_server, which stop them once their module or test is done (each server
    is a process of its own: kept to the session's end, a suite's servers pile up in memory)."""

    def launch(*extra: str, via_cli: bool, warmup: bool) -> ServerProcess:
        flags = extra if warmup else (*extra, "--no-warmup")  # only the shared server pays for a full warm-up
        return ServerProcess(tiny_model_with_tokenizer, tmp_path_factory.mktemp("server-log") / "server.log",
                             *flags, via_cli=via_cli)

    yield from _stopping_factory(launch)


@pytest.fixture(scope="module")
def start_module_server(start_server):
    """start_server for a module's fixtures: its servers stop when the module's tests are done."""
    yield from _stopping_factory(start_server)


@pytest.fixture
def start_test_server(start_server):
    """start_server for one test: its servers stop when the test is done."""
    yield from _stopping_factory(start_server)


def _stopping_factory(launch):
    """Yields start(*flags, via_cli=False, warmup=False) -> launch's server, and stops each server it started
    afterwards (a second stop of a stopped server does nothing)."""
    started = []

    def start(*extra: str, via_cli: bool = False, warmup: bool = False) -> ServerProcess:
        server = launch(*extra, via_cli=via_cli, warmup=warmup)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def server(start_server) -> ServerProcess:
    """The shared server most tests talk to: batches up to 32 sequences; warmed up (the default)."""
    return start_server("--max-num-seqs", "32", "--max-model-len", "256", "--max-num-batched-tokens", "256",
                        warmup=True)
