"""Shim of vLLM's tests/utils.py: RemoteOpenAIServer starts `jaxllm serve` instead of `vllm serve`.

The server always runs jaxllm's default model (SmolLM2-135M-Instruct), served under the model name the test passes.
vLLM CLI arguments that `jaxllm serve` accepts pass through (read from jaxllm's own parser, so flags added later are
used); --skip-tokenizer-init becomes --skip-tokenizer; the rest, and those in DROP_ALWAYS, are dropped. Each server
start is recorded, with what was dropped, in <work dir>/logs/dropped_args.tsv; its output in
<work dir>/logs/server-<port>-<time>.log."""
import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import requests

from vllm.utils.network_utils import get_open_port

WORK_DIR = Path(__file__).resolve().parent.parent
VLLM_PATH = WORK_DIR  # vLLM's tests read files relative to their repository root
ROCM_EXTRA_ARGS: list[str] = []
LOG_DIR = WORK_DIR / "logs"
JAXLLM = os.environ.get("JAXLLM_BIN", str(Path(sys.executable).parent / "jaxllm"))
XLA_CACHE = os.environ.get("JAXLLM_SHIM_XLA_CACHE", str(WORK_DIR / "xla-cache"))

DEFAULT_MODEL_MAX_LEN = 8192  # positions the default model holds; vLLM's test models hold more
DEFAULT_MAX_MODEL_LEN = 2048  # when the test sets none: compiles quickly on CPU
RENAME = {"--skip-tokenizer-init": "--skip-tokenizer"}
# Flags jaxllm takes but that cannot apply here: --dtype (on CPU jaxllm's float32 default is the fastest), and the
# LoRA flags (their adapters are Hugging Face repos that are not downloaded; tests of LoRA names are out of scope).
DROP_ALWAYS = {"--dtype", "--enable-lora", "--lora-modules", "--max-lora-rank", "--max-cpu-loras", "--max-loras"}


@functools.lru_cache(maxsize=1)
def _jaxllm_serve_flags() -> dict[str, bool]:
    """Option string of `jaxllm serve` -> whether it takes a value."""
    from jaxllm.entrypoints.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt: action.nargs != 0 for action in commands.choices["serve"]._actions for opt in action.option_strings}


def _values_after(args: list[str], start: int) -> list[str]:
    """The tokens from args[start] up to the next `--flag`."""
    end = start
    while end < len(args) and not args[end].startswith("--"):
        end += 1
    return args[start:end]


def translate_args(args: list[str]) -> tuple[list[str], list[str]]:
    """vLLM serve arguments -> (arguments for `jaxllm serve`, arguments dropped)."""
    flags = _jaxllm_serve_flags()
    kept, dropped = [], []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("-"):  # a positional argument (vLLM's model): the shim passes none
            dropped.append(token)
            continue
        name, has_eq, inline_value = token.partition("=")
        name = RENAME.get(name, name)
        if has_eq:
            values = [inline_value]
        elif flags.get(name, True):  # takes a value, or unknown: take what follows up to the next flag
            values = _values_after(args, i)
            i += len(values)
        else:
            values = []
        if name in flags and name not in DROP_ALWAYS:
            kept += [name, *values]
        elif has_eq:
            dropped.append(token)
        else:
            dropped += [name, *values]
    return kept, dropped


def _cap_max_model_len(args: list[str], dropped: list[str]) -> None:
    """A --max-model-len above the default model's context is lowered to it (in place), and noted as dropped."""
    for i in range(len(args) - 1):
        if args[i] == "--max-model-len" and int(args[i + 1]) > DEFAULT_MODEL_MAX_LEN:
            dropped.append(f"--max-model-len={args[i + 1]}(capped:{DEFAULT_MODEL_MAX_LEN})")
            args[i + 1] = str(DEFAULT_MODEL_MAX_LEN)


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value after the last `flag` in args, or None."""
    value = None
    for key, val in zip(args, args[1:]):
        if key == flag:
            value = val
    return value


class RemoteOpenAIServer:
    """`jaxllm serve` in a subprocess, with the interface of vLLM's test helper of the same name."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str], *, env_dict=None, seed: int | None = 0,
                 auto_port: bool = True, max_wait_seconds: float | None = None, override_hf_configs=None,
                 **kwargs) -> None:
        args = self._vllm_args(vllm_serve_args, seed, auto_port, override_hf_configs)
        jaxllm_args, dropped = translate_args(args)
        _cap_max_model_len(jaxllm_args, dropped)
        jaxllm_args = self._with_defaults(jaxllm_args, model)
        self.model = model
        self.uds = None
        self.host = _flag_value(jaxllm_args, "--host") or "127.0.0.1"
        self.port = int(_flag_value(jaxllm_args, "--port"))
        self.show_hidden_metrics = any(a.startswith("--show-hidden-metrics-for-version") for a in vllm_serve_args)
        self.dropped = dropped
        LOG_DIR.mkdir(exist_ok=True)
        self._record_args(model, jaxllm_args, dropped)
        self._start(jaxllm_args, env_dict)
        try:
            self._wait_for_server(self.url_for("health"), max_wait_seconds or 300)
        except Exception:
            self._shutdown()
            raise

    @staticmethod
    def _vllm_args(vllm_serve_args, seed, auto_port, override_hf_configs) -> list[str]:
        """The test's arguments plus the port, seed and HF overrides, as vLLM's helper adds them."""
        args = list(vllm_serve_args)
        if "--uds" in args:
            pytest.skip("out of scope: --uds (unix socket serving)")
        if auto_port:
            if "-p" in args or "--port" in args:
                raise ValueError("You have manually specified the port when `auto_port=True`.")
            args += ["--port", str(get_open_port())]
        if seed is not None:
            if "--seed" in args:
                raise ValueError(f"You have manually specified the seed when `seed={seed}`.")
            args += ["--seed", str(seed)]
        if override_hf_configs is not None:
            args += ["--hf-overrides", json.dumps(override_hf_configs)]
        return args

    @staticmethod
    def _with_defaults(args: list[str], model: str) -> list[str]:
        """Port, served name and context length when the test sets none; no warmup; a shared compilation cache."""
        args = list(args)
        if "--port" not in args:
            args += ["--port", "8000"]
        if "--served-model-name" not in args:
            args += ["--served-model-name", model]
        if "--max-model-len" not in args:
            args += ["--max-model-len", str(DEFAULT_MAX_MODEL_LEN)]
        return args + ["--no-warmup", "--compilation-cache-dir", XLA_CACHE]

    @staticmethod
    def _record_args(model: str, args: list[str], dropped: list[str]) -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(LOG_DIR / "dropped_args.tsv", "a") as f:
            f.write(f"{test}\t{model}\t{' '.join(dropped)}\t{' '.join(args)}\n")

    def _start(self, args: list[str], env_dict) -> None:
        env = os.environ.copy()
        env.update(env_dict or {})
        self._log_path = LOG_DIR / f"server-{self.port}-{int(time.time())}.log"
        self._log = open(self._log_path, "w")
        cmd = [JAXLLM, "serve", *args]
        print(f"Launching jaxllm with: {' '.join(cmd)} (dropped: {self.dropped})")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def _wait_for_server(self, url: str, timeout: float) -> None:
        """Poll /health until it answers 200; fail with the log's tail if the server exits first."""
        deadline = time.time() + timeout
        while True:
            try:
                if requests.get(url, timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                tail = self._log_path.read_text()[-3000:]
                raise RuntimeError(f"jaxllm serve exited with {self.proc.returncode}:\n{tail}")
            if time.time() > deadline:
                raise RuntimeError("Server failed to start in time.")
            time.sleep(0.5)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._shutdown()

    def _shutdown(self) -> None:
        """SIGTERM to the server's process group; SIGKILL if it is still up after 20 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        """url_root joined with the given path parts (empty parts skipped, each part's slashes trimmed)."""
        segments = [part.strip("/") for part in parts if part]
        return "/".join([self.url_root, *segments]) if segments else self.url_root + "/"

    def get_client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(**self._client_kwargs(kwargs))

    def get_async_client(self, **kwargs) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(**self._client_kwargs(kwargs))

    def _client_kwargs(self, kwargs: dict) -> dict:
        """The OpenAI client's settings: this server's /v1, the dummy key, no retries, a 600 s default timeout."""
        settings = {"base_url": self.url_for("v1"), "api_key": self.DUMMY_API_KEY, "max_retries": 0, "timeout": 600}
        return {**settings, **kwargs}


def _passthrough_decorator(*args, **kwargs):
    """GPU-requirement markers: applied bare (@multi_gpu_only) or with arguments, they leave the test as it is."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda test: test


multi_gpu_only = requires_fp8 = single_gpu_only = _passthrough_decorator


def __getattr__(name):
    """Any other name from vLLM's tests/utils.py: a vLLM-internal stub."""
    if name.startswith("__"):
        raise AttributeError(name)
    from vllm import make_stub

    return make_stub(f"tests.utils.{name}")
