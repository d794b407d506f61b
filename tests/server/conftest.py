"""Real server subprocesses over a tiny random-weight Llama that uses the default model's tokenizer (so text
prompts, the chat template and the openai client all work) while loading and compiling in seconds."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

TINY_CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=64,
                   intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                   bos_token_id=1, eos_token_id=2, hidden_act="silu", torch_dtype="float32")
SERVED_NAME = "tiny"
STARTUP_TIMEOUT_S = 180


def _tiny_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim

    def normal(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden),
               "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({p + "input_layernorm.weight": np.ones(hidden, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
                        p + "self_attn.q_proj.weight": normal(hidden, hidden),
                        p + "self_attn.k_proj.weight": normal(kv, hidden),
                        p + "self_attn.v_proj.weight": normal(kv, hidden),
                        p + "self_attn.o_proj.weight": normal(hidden, hidden),
                        p + "mlp.gate_proj.weight": normal(inter, hidden),
                        p + "mlp.up_proj.weight": normal(inter, hidden),
                        p + "mlp.down_proj.weight": normal(hidden, inter)})
    return weights


@pytest.fixture(scope="session")
def tiny_model_with_tokenizer(tmp_path_factory) -> Path:
    from safetensors.numpy import save_file

    from jaxllm.loaders import resolve_model
    from jaxllm.tokenizer import load_tokenizer

    directory = tmp_path_factory.mktemp("tiny-server-model")
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    save_file(_tiny_weights(TINY_CONFIG), str(directory / "model.safetensors"))
    load_tokenizer(resolve_model(None)).save_pretrained(str(directory))
    return directory


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
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
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
    """Factory: start_server(*flags, via_cli=False) -> a healthy ServerProcess, stopped at the end of the
    session."""
    started = []

    def start(*extra: str, via_cli: bool = False) -> ServerProcess:
        server = ServerProcess(tiny_model_with_tokenizer, tmp_path_factory.mktemp("server-log") / "server.log",
                               *extra, via_cli=via_cli)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def server(start_server) -> ServerProcess:
    """The shared server most tests talk to: batches up to 32 sequences."""
    return start_server("--max-num-seqs", "32", "--max-model-len", "256", "--max-num-batched-tokens", "256")
