"""Shared fixtures: tiny random-weight Hugging Face models of every supported architecture variant, and AWQ
checkpoints of them written by `jaxllm quantize`. First of all, before anything imports JAX: the test process's
fake CPU devices (tests/fake_devices.py), so that tensor-parallel tests run in-process on jax.devices()[:N]."""

from __future__ import annotations

from tests.fake_devices import use_fake_devices

use_fake_devices()

import shutil  # noqa: E402

import pytest  # noqa: E402

from tests.tiny_models import (AWQ_GROUP, VARIANTS, byte_tokenizer, save_tiny_hf_model,  # noqa: E402
                               save_tiny_model_with_tokenizer)


@pytest.fixture(scope="session", autouse=True)
def float32_auto_dtype_on_cpu():
    """dtype="auto" on a CPU follows its flags (bfloat16 with AMX or AVX512-BF16); the suite's references are
    float32, so this process and the servers and commands it starts see an AVX2 CPU (JAXLLM_CPU_FLAGS;
    tests/loaders/test_cpu_dtype.py tests the choice with other flags)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAXLLM_CPU_FLAGS", "avx2 fma")
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Returns a function variant -> (directory with config.json + model.safetensors, torch model)."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            cache[variant] = save_tiny_hf_model(variant, tmp_path_factory.mktemp(variant))
        return cache[variant]

    return get


@pytest.fixture(scope="session")
def tiny_model_with_tokenizer(tmp_path_factory):
    """A tiny random Llama with the default model's tokenizer (tests/tiny_models.py)."""
    return save_tiny_model_with_tokenizer(tmp_path_factory.mktemp("tiny-model-with-tokenizer"))


@pytest.fixture(scope="session")
def quantizable_model(tiny_model_dir, tmp_path_factory):
    """variant -> (a copy of the tiny HF model directory with a byte tokenizer added, the torch model). A copy:
    the shared tiny model directories stay as other tests expect them (no tokenizer)."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            source, model = tiny_model_dir(variant)
            target = tmp_path_factory.mktemp(f"quantizable-{variant}") / "model"
            shutil.copytree(source, target)
            byte_tokenizer().save_pretrained(str(target))
            cache[variant] = (target, model)
        return cache[variant]

    return get


@pytest.fixture(scope="session")
def awq_model_dir(quantizable_model, tmp_path_factory):
    """(variant, method "rtn" or "awq", group size) -> an AutoAWQ GEMM checkpoint of the tiny model."""
    from jaxllm.entrypoints.cli import main

    cache = {}

    def get(variant: str, method: str = "rtn", group_size: int = AWQ_GROUP):
        key = (variant, method, group_size)
        if key not in cache:
            name = f"{variant}-{method}-g{group_size}"
            out = tmp_path_factory.mktemp(name) / name
            assert main(["quantize", str(quantizable_model(variant)[0]), str(out), "--method", method,
                         "--group-size", str(group_size), "--max-calibration-tokens", "1024"]) == 0
            cache[key] = out
        return cache[key]

    return get


def pytest_generate_tests(metafunc):
    if "variant" in metafunc.fixturenames:
        metafunc.parametrize("variant", sorted(VARIANTS))
