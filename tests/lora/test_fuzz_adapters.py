"""Random corruptions of a valid PEFT adapter (adapter_config.json, the weights file's bytes, header and values),
seeded and bounded in count: each one reads a still-valid adapter or is refused by a one-line ValueError (a
ModelLoadError where a value is bad) naming a file of the adapter, in bounded time and memory."""

from __future__ import annotations

import collections
import random
import shutil

import numpy as np
import pytest

from jaxllm.lora.peft import load_peft_adapter
from tests.file_corruptions import (check_outcome, corrupt_bytes_file, corrupt_json_file,
                                    corrupt_safetensors_header, corrupt_safetensors_values, peak_rss_bytes)

CASES = 80
SEED = 20240604
MAX_RANK = 8


@pytest.fixture(scope="module")
def base_config(tiny_model_dir):
    from jaxllm.loaders import load_host_model

    return load_host_model(tiny_model_dir("llama3")[0]).config


def corrupt(adapter, rng: random.Random) -> str:
    target = rng.choices(["config", "bytes", "header", "values"], weights=[40, 20, 20, 20])[0]
    if target == "config":
        return corrupt_json_file(adapter / "adapter_config.json", rng)
    weights = adapter / "adapter_model.safetensors"
    if target == "bytes":
        return corrupt_bytes_file(weights, rng, head=rng.choice([None, 2048]))
    return (corrupt_safetensors_header if target == "header" else corrupt_safetensors_values)(weights, rng)


def read(adapter, config) -> None:
    for a, b in load_peft_adapter(str(adapter), config, MAX_RANK, np.float32).values():
        assert np.isfinite(a).all() and np.isfinite(b).all()


def test_corrupted_adapters_read_or_are_refused_by_name(peft_adapter, base_config, tmp_path):
    source, _ = peft_adapter("llama3", "fuzz", rank=4)
    read(source, base_config)  # the template is valid
    baseline = peak_rss_bytes()
    outcomes = collections.Counter()
    for case in range(CASES):
        rng = random.Random(SEED * 1000 + case)
        adapter = shutil.copytree(source, tmp_path / f"case{case}")
        what = f"case {case}: {corrupt(adapter, rng)}"
        outcomes[check_outcome(lambda: read(adapter, base_config), (str(adapter),), what, refusals=(ValueError,))] += 1
        shutil.rmtree(adapter)
    assert outcomes["refused"] >= CASES // 2, outcomes
    assert peak_rss_bytes() - baseline < 1 << 30
