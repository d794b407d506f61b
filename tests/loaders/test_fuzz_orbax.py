"""Random corruptions of a valid jaxllm orbax checkpoint (its description's JSON, the bytes of any file orbax
wrote), seeded and bounded in count: each one loads a still-valid model or is refused by a one-line
ModelLoadError naming a file of the checkpoint, in bounded time and memory."""

from __future__ import annotations

import collections
import random
import shutil

import pytest

from jaxllm import load_model
from jaxllm.loaders import save_checkpoint
from tests.file_corruptions import (assert_finite_params, check_outcome, corrupt_bytes_file, corrupt_json_file,
                                    peak_rss_bytes)

CASES = 30
SEED = 20240603


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    loaded = load_model(tiny_model_dir("llama3")[0])
    path = save_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt", loaded.config, loaded.params)
    load_model(path)  # the template is valid
    return path


def test_corrupted_checkpoints_load_or_are_refused_by_name(checkpoint, tmp_path):
    files = sorted(p.relative_to(checkpoint) for p in (checkpoint / "params").rglob("*") if p.is_file())
    baseline = peak_rss_bytes()
    outcomes = collections.Counter()
    for case in range(CASES):
        rng = random.Random(SEED * 1000 + case)
        copy = shutil.copytree(checkpoint, tmp_path / f"case{case}")
        if rng.random() < 0.5:
            what = corrupt_json_file(copy / "jaxllm_checkpoint.json", rng)
        else:
            name = rng.choice(files)
            what = f"{name.parent}/{corrupt_bytes_file(copy / name, rng)}"
        what = f"case {case}: {what}"
        outcomes[check_outcome(lambda: assert_finite_params(load_model(copy).params), (str(copy),), what)] += 1
        shutil.rmtree(copy)
    assert outcomes["refused"] >= CASES // 3, outcomes
    assert peak_rss_bytes() - baseline < 1 << 30
