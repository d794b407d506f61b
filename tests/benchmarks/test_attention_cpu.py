"""benchmarks/attention_cpu.py: `--cold` reads the pool's layers in turn (each call's K/V from memory, as in the
model's forward); the default reads one layer."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
from tests.benchmarks.scripts import load_script


def _layers_read(module, layers: int, repeats: int) -> list[tuple[int, int]]:
    """(layer read, the pool's layers) of each call time_step makes, through a recording backend."""
    calls = []
    reference = module.BACKENDS["reference"]

    def recording(q, k_pool, v_pool, layer, *rest, **options):  # runs jitted: the layer is read at run time
        jax.debug.callback(lambda read: calls.append((int(read), k_pool.shape[0])), layer, ordered=True)
        return reference(q, k_pool, v_pool, layer, *rest, **options)

    module.BACKENDS["recording"] = recording
    seconds = module.time_step("recording", [(1, 20), (1, 5)], jnp.float32, repeats, layers)
    assert seconds > 0
    return calls


def test_cold_reads_every_layer_in_turn():
    module = load_script("attention_cpu")
    calls = _layers_read(module, layers=4, repeats=2)  # the first call compiles, untimed
    assert [layer for layer, _ in calls] == [0, 0, 1, 2, 3, 0, 1, 2, 3]
    assert {pool for _, pool in calls} == {4}


def test_warm_reads_one_layer():
    module = load_script("attention_cpu")
    calls = _layers_read(module, layers=1, repeats=3)
    assert calls == [(0, 1)] * 4


def test_the_cold_flag_runs_the_model_s_layers(capsys, monkeypatch):
    module = load_script("attention_cpu")
    monkeypatch.setattr(sys, "argv", ["attention_cpu.py", "--batch-sizes", "1", "--contexts", "16",
                                      "--backends", "reference", "--repeats", "1", "--cold"])
    module.main()
    out = capsys.readouterr().out
    assert "cold: each call reads the next of 30 layers" in out
    assert "| reference | 1 | 16 |" in out
