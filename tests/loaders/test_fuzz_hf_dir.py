"""Random corruptions of a valid sharded Hugging Face directory (config.json, generation_config.json, the index,
the shards' bytes, headers and values), seeded and bounded in count: each one loads a still-valid model or is
refused by a one-line ModelLoadError naming the directory's file, in bounded time and memory."""

from __future__ import annotations

import collections
import json
import random
import shutil

import pytest
from safetensors.numpy import load_file, save_file

from jaxllm import load_model
from tests.file_corruptions import (assert_finite_params, check_outcome, corrupt_bytes_file, corrupt_json_file,
                                    corrupt_safetensors_header, corrupt_safetensors_values, peak_rss_bytes)

CASES = 80
SEED = 20240601
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture(scope="module")
def sharded_model(tiny_model_dir, tmp_path_factory):
    """The tiny Llama 3 model (rope scaling: more config to corrupt), split into two shards and an index."""
    model = shutil.copytree(tiny_model_dir("llama3")[0], tmp_path_factory.mktemp("sharded") / "model")
    tensors = load_file(model / "model.safetensors")
    names = sorted(tensors)
    for shard, part in zip(SHARDS, (names[::2], names[1::2])):
        save_file({n: tensors[n] for n in part}, model / shard)
    (model / "model.safetensors").unlink()
    weight_map = {n: SHARDS[i % 2] for i, n in enumerate(names)}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    load_model(model)  # the template is valid
    return model


def corrupt(model, rng: random.Random) -> str:
    target = rng.choices(["config", "generation", "index", "bytes", "header", "values"],
                         weights=[35, 5, 10, 20, 15, 15])[0]
    if target in ("config", "generation", "index"):
        name = {"config": "config.json", "generation": "generation_config.json",
                "index": "model.safetensors.index.json"}[target]
        return corrupt_json_file(model / name, rng)
    shard = model / rng.choice(SHARDS)
    if target == "bytes":
        return corrupt_bytes_file(shard, rng, head=rng.choice([None, 4096]))
    return (corrupt_safetensors_header if target == "header" else corrupt_safetensors_values)(shard, rng)


def test_corrupted_directories_load_or_are_refused_by_name(sharded_model, tmp_path):
    baseline = peak_rss_bytes()
    outcomes = collections.Counter()
    for case in range(CASES):
        rng = random.Random(SEED * 1000 + case)
        model = shutil.copytree(sharded_model, tmp_path / f"case{case}")
        what = f"case {case}: {corrupt(model, rng)}"
        outcomes[check_outcome(lambda: assert_finite_params(load_model(model).params), (str(model),), what)] += 1
        shutil.rmtree(model)
    assert outcomes["refused"] >= CASES // 2, outcomes
    assert peak_rss_bytes() - baseline < 1 << 30
