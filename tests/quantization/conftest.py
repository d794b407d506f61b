"""Tiny random models (tests/tiny_models.py) with a tokenizer of their own, ready to quantize."""

from __future__ import annotations

import shutil

import pytest


def byte_tokenizer():
    """A byte-level tokenizer without merges: exactly 256 ids, the tiny models' vocabulary size."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


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
