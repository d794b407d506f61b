"""`jaxllm generate` and `jaxllm serve` on a hostile model file exit with status 2 and one line
`jaxllm: error: FILE: problem` on stderr: no traceback."""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal

import pytest
from safetensors.numpy import load_file, save_file

from jaxllm.entrypoints.cli import main
from tests.tiny_models import write_gguf


def _config_heads_zero(model):
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    return model, r"config\.json: num_attention_heads must be an integer"


def _nan_weight(model):
    tensors = load_file(model / "model.safetensors")
    tensors["model.norm.weight"][0] = float("nan")
    save_file(tensors, model / "model.safetensors")
    return model, r"model\.safetensors: tensor 'model\.norm\.weight' holds NaN"


def _shard_outside(model):
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "/etc/passwd"}}))
    return model, r"index\.json: weight_map names '/etc/passwd'"


@pytest.fixture
def restore_server_settings():
    """`serve` runs in this process: it sets jaxllm's log level and a SIGTERM handler, put back afterwards (a later
    test would otherwise see jaxllm's INFO lines)."""
    logger = logging.getLogger("jaxllm")
    level, handler = logger.level, signal.getsignal(signal.SIGTERM)
    yield
    logger.setLevel(level)
    signal.signal(signal.SIGTERM, handler)


@pytest.mark.parametrize("make", [_config_heads_zero, _nan_weight, _shard_outside], ids=["config", "nan", "index"])
@pytest.mark.parametrize("command", ["generate", "serve"])
def test_hostile_directory_is_one_error_line_and_status_2(tiny_model_dir, tmp_path, capsys, make, command,
                                                          restore_server_settings):
    model, message = make(shutil.copytree(tiny_model_dir("llama2")[0], tmp_path / "model"))
    argv = ["generate", "hello", "--model", str(model)] if command == "generate" else ["serve", str(model)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("jaxllm: error: ") and "Traceback" not in "\n".join(err), err
    assert re.search(message, err[-1]), err
    assert len([line for line in err if "jaxllm: error" in line]) == 1


def test_corrupt_gguf_is_one_error_line_and_status_2(tiny_model_dir, tmp_path, capsys):
    path = write_gguf(tiny_model_dir("llama2")[1], tmp_path / "cut.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3])
    assert main(["generate", "hello", "--model", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"jaxllm: error: {path}: cannot read GGUF file"), err
