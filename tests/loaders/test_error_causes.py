"""A ModelLoadError keeps the error that caused it (`__cause__`), so a traceback shows what the reader saw."""

from __future__ import annotations

import shutil

import pytest

from jaxllm import ModelLoadError, ModelNotFoundError, load_model
from tests.tiny_models import write_gguf


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_corrupt_safetensors_error_keeps_its_cause(tiny_model_dir, tmp_path):
    model = shutil.copytree(tiny_model_dir("llama2")[0], tmp_path / "model")
    _truncate(model / "model.safetensors")
    with pytest.raises(ModelLoadError, match="truncated or corrupt") as raised:
        load_model(model)
    assert raised.value.__cause__ is not None
    assert str(raised.value.__cause__) in str(raised.value)


def test_corrupt_gguf_error_keeps_its_cause(tiny_model_dir, tmp_path):
    path = _truncate(write_gguf(tiny_model_dir("llama2")[1], tmp_path / "cut.gguf"))
    with pytest.raises(ModelLoadError, match="truncated or corrupt") as raised:
        load_model(path)
    assert raised.value.__cause__ is not None


def test_invalid_config_json_error_keeps_its_cause(tiny_model_dir, tmp_path):
    model = shutil.copytree(tiny_model_dir("llama2")[0], tmp_path / "model")
    (model / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON") as raised:
        load_model(model)
    assert raised.value.__cause__ is not None


def test_model_missing_from_hf_cache_keeps_its_cause(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError, match="never downloads") as raised:
        load_model("acme/absent")
    assert raised.value.__cause__ is not None
