"""An adapter whose config or tensors are hostile is refused by name (a ModelLoadError, which is a ValueError,
naming the file): rank-0 modules, NaN or infinite alpha or weights, integer weights, values of the wrong type."""

from __future__ import annotations

import numpy as np
import pytest

from jaxllm import ModelLoadError
from tests.lora.test_refusals import adapter_copy, config, edit_config, edit_tensors, load  # noqa: F401 (fixtures)

Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


@pytest.mark.parametrize("changes, message", [
    (dict(lora_alpha=float("nan")), r"lora_alpha must be a positive number \(finite\), got nan"),
    (dict(lora_alpha=float("inf")), r"lora_alpha must be a positive number \(finite\), got inf"),
    (dict(r=float("nan")), r"r must be a positive number \(finite\), got nan"),
    (dict(r=[4]), r"r must be a positive number \(finite\), got \[4\]"),
    (dict(lora_alpha=1e308), r"lora_alpha 1e\+308 scales the w_qkv lora_B weights beyond the range of float32"),
    (dict(use_rslora="yes"), r"use_rslora must be true or false, got 'yes'"),
    (dict(target_modules=5), r"target_modules must be a list of module names or a pattern, got 5"),
    (dict(target_modules=[["q_proj"]]), r"target_modules must be a list of strings"),
    (dict(bias=["none"]), r"bias must be a string"),
    (dict(peft_type=None, use_dora="x" * 500), r"DoRA \(use_dora\) is not supported \(use_dora = 'x{20,60}\.\.\."),
], ids=lambda v: None if isinstance(v, dict) else "")
def test_bad_config_values_are_refused_by_name(adapter_copy, config, changes, message):  # noqa: F811
    edit_config(adapter_copy, **changes)
    with pytest.raises(ModelLoadError, match=r"adapter_config\.json: " + message):
        load(adapter_copy, config)


def _rank_0(tensors):
    tensors[Q_A] = np.zeros((0, tensors[Q_A].shape[1]), np.float32)
    tensors[Q_B] = np.zeros((tensors[Q_B].shape[0], 0), np.float32)


def _set(name, value):
    def change(tensors):
        tensors[name] = tensors[name].copy()
        tensors[name][1, 2] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_rank_0, rf"tensor '{Q_A}' has rank 0 \(shape \[0, 64\]\): a LoRA module needs rank >= 1"),
    (_set(Q_A, np.nan), rf"tensor '{Q_A}' holds NaN or infinite values"),
    (_set(Q_B, np.inf), rf"tensor '{Q_B}' holds NaN or infinite values"),
    (lambda t: t.update({Q_B: t[Q_B].astype(np.int32)}), rf"tensor '{Q_B}' is int32: weights must be floating"),
], ids=["rank-0", "nan-A", "inf-B", "int-B"])
def test_bad_tensors_are_refused_by_name(adapter_copy, config, change, message):  # noqa: F811
    edit_tensors(adapter_copy, change)
    with pytest.raises(ModelLoadError, match=r"adapter_model\.safetensors: " + message):
        load(adapter_copy, config)
