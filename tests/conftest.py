"""Shared fixtures: tiny random-weight Hugging Face models of every supported architecture variant."""

from __future__ import annotations

import pytest

from tests.tiny_models import VARIANTS, save_tiny_hf_model, save_tiny_model_with_tokenizer


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


def pytest_generate_tests(metafunc):
    if "variant" in metafunc.fixturenames:
        metafunc.parametrize("variant", sorted(VARIANTS))
