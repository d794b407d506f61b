"""Fixtures: PEFT adapters of the tiny models, each with its merged Hugging Face reference."""

from __future__ import annotations

import pytest

from tests.lora.adapters import save_peft_adapter


@pytest.fixture(scope="session")
def peft_adapter(tiny_model_dir, tmp_path_factory):
    """(variant, name, **LoraConfig options) -> (adapter directory, merged torch model); cached per arguments."""
    cache = {}

    def get(variant: str, name: str, **options):
        key = (variant, name, tuple(sorted(options.items())))
        if key not in cache:
            _, hf_model = tiny_model_dir(variant)
            seed = sum(map(ord, name))
            cache[key] = save_peft_adapter(hf_model, tmp_path_factory.mktemp(f"lora-{variant}-{name}"), seed=seed,
                                           **options)
        return cache[key]

    return get
