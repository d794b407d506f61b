"""Loading a model split over N devices places each device's part straight from the host: device 0 never holds more
than its own share (about 1/N of the model, plus the replicated embedding and norms), where loading it whole first
held the whole model there. Safetensors, GGUF and orbax sources, at N = 4 (and 2), on the test process's fake CPU
devices (tests/conftest.py); the values equal the previous path's bit for bit."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest

from jaxllm.loaders import load_model, save_checkpoint
from jaxllm.benchmarks.load_memory import DevicePeak
from jaxllm.model import tensor_parallel as tp
from jaxllm.model.params import param_bytes
from tests.tiny_models import write_gguf


def measure(model: str, n: int) -> dict:
    """What device 0 held loading `model` split over N devices:
        peak       most bytes of live arrays on device 0 during the load (sampled after each array is placed)
        share      device 0's bytes once loaded
        replicated bytes of the arrays every device holds whole
        laid_out   bytes of the loaded params, each array counted once
        whole      bytes of the same model loaded on one device
        equal      the values and shardings equal the previous path's: loaded whole on one device, laid out there
                   (tensor_parallel.shard_major_params on device arrays), then split with jax.device_put
        previous_peak  device 0's peak along that previous path (the gauge sees a whole-model copy)"""
    gc.collect()  # the gauges count live arrays above their baseline: earlier tests' garbage must not go mid-load
    mesh = tp.make_mesh(n)
    device0 = mesh.devices.flat[0].id
    gauge = DevicePeak()
    loaded = load_model(model, mesh=mesh, on_placed=gauge.sample)
    gauge.sample()
    leaves = jax.tree.leaves(loaded.params)
    row = {"peak": gauge.peak.get(device0, 0),
           "share": sum(leaf.addressable_shards[0].data.nbytes for leaf in leaves),
           "replicated": sum(leaf.nbytes for leaf in leaves if leaf.sharding.is_fully_replicated),
           "laid_out": sum(leaf.nbytes for leaf in leaves)}
    previous = DevicePeak()
    whole = load_model(model, on_placed=previous.sample)
    row["whole"] = param_bytes(whole.params)
    laid_out = tp.shard_major_params(whole.params, whole.config, n)
    previous.sample()
    reference = jax.device_put(laid_out, tp.param_shardings(laid_out, mesh))
    previous.sample()
    row["previous_peak"] = previous.peak.get(device0, 0)  # above what the sharded load left there
    row["equal"] = all(a.sharding == b.sharding and a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
                       for a, b in zip(leaves, jax.tree.leaves(reference), strict=True))
    return row


@pytest.fixture(scope="module")
def report(tiny_model_dir, tmp_path_factory) -> dict:
    """{"NAME/tpN": measure's row}."""
    directory, hf_model = tiny_model_dir("llama2")  # 4 query and 4 KV heads: N = 4 splits every head axis evenly
    tmp = tmp_path_factory.mktemp("sharded-loading")
    gguf = write_gguf(hf_model, tmp / "model.gguf")
    bf16 = load_model(directory, dtype="bfloat16")
    checkpoint = save_checkpoint(tmp / "checkpoint", bf16.config, bf16.params)
    del bf16
    cases = {"hf": (directory, (2, 4)), "gguf": (gguf, (4,)), "orbax-bf16": (checkpoint, (4,))}
    return {f"{name}/tp{n}": measure(str(model), n) for name, (model, sizes) in cases.items() for n in sizes}


def test_device_0_holds_at_most_its_share_while_loading(report):
    assert set(report) == {"hf/tp2", "hf/tp4", "gguf/tp4", "orbax-bf16/tp4"}
    for name, row in report.items():
        n = int(name.rsplit("tp", 1)[1])
        assert row["laid_out"] == row["whole"], row  # no head is replicated, the vocabulary splits evenly
        assert row["share"] == row["replicated"] + (row["whole"] - row["replicated"]) // n, (name, row)
        assert row["peak"] == row["share"], (name, row)
        assert row["previous_peak"] > row["whole"], (name, row)  # loaded whole, then split: the gauge sees it
    quarter = report["hf/tp4"]
    assert quarter["peak"] < 0.4 * quarter["whole"], quarter


def test_sharded_values_equal_the_previous_path(report):
    assert all(row["equal"] for row in report.values()), report
