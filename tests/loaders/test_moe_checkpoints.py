"""Mixture-of-experts checkpoints: experts stacked at load in order, Qwen's dense layers read per HF's rule, and a
clear error naming the field or tensor for every bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxllm import ModelLoadError, load_model


def _copy(tiny_model_dir, tmp_path, variant):
    return shutil.copytree(tiny_model_dir(variant)[0], tmp_path / "model")


def _edit_config(model, **changes):
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


def test_experts_stack_in_order_with_gate_rows_then_up(tiny_model_dir):
    directory, _ = tiny_model_dir("mixtral")
    tensors = load_file(directory / "model.safetensors")
    layer = load_model(directory).params.layers[1]
    prefix = "model.layers.1.block_sparse_moe"
    for e in range(8):
        np.testing.assert_array_equal(np.asarray(layer.w_experts_gate_up[e]), np.concatenate(
            [tensors[f"{prefix}.experts.{e}.w1.weight"], tensors[f"{prefix}.experts.{e}.w3.weight"]]))
        np.testing.assert_array_equal(np.asarray(layer.w_experts_down[e]), tensors[f"{prefix}.experts.{e}.w2.weight"])
    np.testing.assert_array_equal(np.asarray(layer.router), tensors[f"{prefix}.gate.weight"])


@pytest.mark.parametrize("family, dense", [("qwen3_moe", (1,)), ("qwen3_moe_sparse_step", (0,)),
                                            ("qwen2_moe", ())])
def test_dense_layers_follow_hf(family, dense, tiny_model_dir):
    loaded = load_model(tiny_model_dir(family)[0])
    assert loaded.config.dense_layers == dense
    for i, layer in enumerate(loaded.params.layers):
        assert (layer.router is None) == (i in dense) and (layer.w_gate_up is None) == (i not in dense)


@pytest.mark.parametrize("changes, named", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok"),
    (dict(mlp_only_layers=[5]), "mlp_only_layers"),
    (dict(mlp_only_layers="1"), "mlp_only_layers"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step"),
    (dict(moe_intermediate_size=-1), "moe_intermediate_size"),
    (dict(use_sliding_window=True), "use_sliding_window"),
])
def test_bad_expert_config_is_named(changes, named, tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path, "qwen3_moe")
    _edit_config(model, **changes)
    with pytest.raises(ModelLoadError, match=named):
        load_model(model)


def test_missing_expert_tensor_is_named(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path, "qwen2_moe")
    tensors = load_file(model / "model.safetensors")
    del tensors["model.layers.0.mlp.experts.5.up_proj.weight"]
    save_file(tensors, model / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensors: layer 0 expert\.5\.up"):
        load_model(model)


def test_more_experts_than_the_config_says_is_named(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path, "qwen3_moe")
    _edit_config(model, num_experts=6)
    with pytest.raises(ModelLoadError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.experts\.6\.\w+\.weight'"):
        load_model(model)


def test_a_dense_mlp_in_a_sparse_layer_is_named(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path, "qwen3_moe")
    _edit_config(model, mlp_only_layers=[])  # layer 1's dense MLP tensors are then unexpected
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.\w+\.weight.*layer 1's MLP is routed"):
        load_model(model)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen3_moe_sparse_step", "qwen2_moe"])
def test_param_count_equals_the_checkpoints_values(family, tiny_model_dir):
    """param_count (the host-memory check's figure, counted per layer kind without a loop over the layers) equals
    the values the checkpoint holds."""
    from jaxllm.config import ModelConfig
    from jaxllm.model.params import param_count

    directory, hf = tiny_model_dir(family)
    config = ModelConfig.from_hf_config(json.loads((directory / "config.json").read_text()))
    stored = sum(int(np.prod(t.shape)) for t in load_file(directory / "model.safetensors").values())
    assert param_count(config) == stored, hf.config
