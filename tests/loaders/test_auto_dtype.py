"""dtype="auto": on a GPU, the dtype the checkpoint's weights are stored in; on a CPU without AMX (as the suite
sees it, tests/conftest.py) float32 (test_cpu_dtype.py: the flags' choice)."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from jaxllm import load_model
from jaxllm.loaders import resolve_model
from jaxllm.loaders.checkpoint_dtype import auto_dtype
from jaxllm.model.params import params_dtype
from tests.tiny_models import write_gguf


@pytest.fixture(scope="module")
def bf16_dir(tiny_model_dir, tmp_path_factory):
    _, model = tiny_model_dir("llama3")
    directory = tmp_path_factory.mktemp("bf16-llama3")
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)  # the fixture's
    return directory                                                                             # model unchanged


def test_safetensors_dtype_is_read_from_the_files(tiny_model_dir, bf16_dir):
    assert auto_dtype(resolve_model(str(bf16_dir))) == "bfloat16"
    assert auto_dtype(resolve_model(str(tiny_model_dir("llama3")[0]))) == "float32"


@pytest.mark.parametrize("matrix_type, expected", [(Q.F32, "float32"), (Q.F16, "float16"), (Q.Q8_0, "bfloat16")])
def test_gguf_dtype_follows_its_matrices(tiny_model_dir, tmp_path, matrix_type, expected):
    path = write_gguf(tiny_model_dir("llama2")[1], tmp_path / "m.gguf", matrix_type=matrix_type)
    assert auto_dtype(resolve_model(str(path))) == expected


def test_auto_is_float32_on_cpu_and_the_checkpoints_dtype_on_gpu(bf16_dir, monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert params_dtype(load_model(str(bf16_dir)).params) == jnp.float32
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert params_dtype(load_model(str(bf16_dir)).params) == jnp.bfloat16
    assert params_dtype(load_model(str(bf16_dir), dtype="float32").params) == jnp.float32  # explicit wins
