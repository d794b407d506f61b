"""Weights that cannot be right are refused by name: NaN or infinite values, integer tensors where floating-point
weights belong, a config that describes more parameters than the machine holds (checked before anything is
allocated), a checkpoint description that disagrees with its saved arrays."""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxllm import ModelLoadError, load_model
from jaxllm.loaders import host_memory, load_checkpoint, save_checkpoint
from tests.tiny_models import write_gguf

TENSOR = "model.layers.1.mlp.up_proj.weight"


@pytest.fixture
def model(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir("llama2")[0], tmp_path / "model")


def edit_tensor(model, change, name=TENSOR):
    tensors = load_file(model / "model.safetensors")
    tensors[name] = change(tensors[name])
    save_file(tensors, model / "model.safetensors")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weight_is_refused_by_file_and_tensor(model, value):
    edit_tensor(model, lambda w: np.where(np.arange(w.size).reshape(w.shape) == 77, value, w).astype(w.dtype))
    with pytest.raises(ModelLoadError, match=rf"model\.safetensors: tensor '{TENSOR}' holds NaN or infinite"):
        load_model(model)


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.bool_])
def test_integer_weight_is_refused_by_file_and_tensor(model, dtype):
    edit_tensor(model, lambda w: w.astype(dtype))
    with pytest.raises(ModelLoadError, match=rf"model\.safetensors: tensor '{TENSOR}' is {np.dtype(dtype).name}: "
                                             "weights must be floating point"):
        load_model(model)


def test_non_finite_gguf_tensor_is_refused(tiny_model_dir, tmp_path):
    hf_model = tiny_model_dir("llama2")[1]
    norm = np.ones(hf_model.config.hidden_size, np.float32)
    norm[3] = np.nan
    path = write_gguf(hf_model, tmp_path / "nan.gguf",
                      tensor_overrides={"blk.0.ffn_norm.weight": (norm, gguf.GGMLQuantizationType.F32)})
    with pytest.raises(ModelLoadError, match=r"nan\.gguf: tensor 'blk\.0\.ffn_norm\.weight' holds NaN"):
        load_model(path)


def _refuse_allocation(monkeypatch):
    def allocating(*args, **kwargs):
        raise AssertionError("the params were being assembled")

    for module in ("safetensors", "gguf"):
        monkeypatch.setattr(f"jaxllm.loaders.{module}.assemble_params", allocating)


def test_absurd_layer_count_is_refused_before_allocating(model, monkeypatch):
    _refuse_allocation(monkeypatch)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9}))
    with pytest.raises(ModelLoadError, match=r"config\.json: the config describes 4\.109e\+13 parameters "
                                             r"\(num_layers 1000000000, .*more than this machine's"):
        load_model(model)


def test_absurd_gguf_block_count_is_refused_before_allocating(tiny_model_dir, tmp_path, monkeypatch):
    _refuse_allocation(monkeypatch)
    hf_model = tiny_model_dir("llama2")[1]
    hf_model.config.num_hidden_layers = 10**9  # the metadata says so; the file holds 2 layers
    try:
        path = write_gguf(hf_model, tmp_path / "deep.gguf")
    finally:
        hf_model.config.num_hidden_layers = 2
    with pytest.raises(ModelLoadError, match=r"deep\.gguf: the config describes .* parameters \(num_layers "
                                             r"1000000000"):
        load_model(path)


def test_the_bound_is_the_machines_memory(model, monkeypatch):
    assert host_memory.host_memory_bytes() > 2**30
    load_model(model)
    monkeypatch.setattr(host_memory, "host_memory_bytes", lambda: 200_000)  # less than the tiny model's weights
    with pytest.raises(ModelLoadError, match=r"0\.000\d+ GiB of memory"):
        load_model(model)


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir, tmp_path_factory):
    """An orbax checkpoint of the tiny Llama 2 model -> its directory (copy it before changing it)."""
    loaded = load_model(tiny_model_dir("llama2")[0])
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt", loaded.config, loaded.params)


def edit_description(directory, **changes):
    marker = directory / "jaxllm_checkpoint.json"
    meta = json.loads(marker.read_text())
    meta["config"].update(changes)
    marker.write_text(json.dumps(meta))


@pytest.mark.parametrize("changes, message", [
    (dict(hidden_size=32), r"its config implies embed of shape \(256, 32\), but params/ holds \(256, 64\)"),
    (dict(num_kv_heads=2), r"its config implies layers\.0\.w_qkv of shape \(128, 64\), but params/ holds "
                           r"\(192, 64\)"),
    (dict(num_layers=3), r"its config implies arrays that params/ lacks: layers\.2\.attn_norm"),
    (dict(num_layers=1), r"its config does not describe the saved arrays: layers\.1\.attn_norm"),
    (dict(tie_word_embeddings=True), r"its config does not describe the saved arrays: lm_head"),
    (dict(num_layers="2"), r"config\.num_layers must be an integer"),
    (dict(rope_theta=float("nan")), r"config\.rope_theta must be a positive number \(finite\), got nan"),
    (dict(num_layers=10**9), r"the config describes .* parameters \(num_layers 1000000000"),
    (dict(extra=1), r"unknown field config\.extra"),
], ids=lambda v: None if isinstance(v, dict) else "")
def test_checkpoint_description_that_disagrees_is_refused_at_load(checkpoint, tmp_path, changes, message):
    copy = shutil.copytree(checkpoint, tmp_path / "ckpt")
    edit_description(copy, **changes)
    with pytest.raises(ModelLoadError, match=r"jaxllm_checkpoint\.json: " + message):
        load_model(copy)


@pytest.mark.parametrize("changes, message", [
    (dict(hidden_size=32), r"its config implies embed of shape \(256, 32\), but params/ holds \(256, 64\)"),
    (dict(num_kv_heads=2), r"its config implies layers\.0\.w_qkv of shape \(128, 64\)"),
])
def test_without_orbax_metadata_the_restored_arrays_are_compared(checkpoint, tmp_path, monkeypatch, changes,
                                                                  message):
    monkeypatch.setattr("jaxllm.loaders.orbax._saved_shapes", lambda path: None)  # an orbax without that metadata
    copy = shutil.copytree(checkpoint, tmp_path / "ckpt")
    edit_description(copy, **changes)
    with pytest.raises(ModelLoadError, match=r"jaxllm_checkpoint\.json: " + message):
        load_model(copy)


def test_checkpoint_with_non_finite_params_is_refused(tiny_model_dir, tmp_path):
    loaded = load_model(tiny_model_dir("llama2")[0])
    layer = loaded.params.layers[1]
    bad = loaded.params.replace(layers=(loaded.params.layers[0], layer.replace(wo=layer.wo.at[0, 0].set(np.inf))))
    path = save_checkpoint(tmp_path / "ckpt", loaded.config, bad)
    with pytest.raises(ModelLoadError, match=r"params: tensor 'layers\.1\.wo' holds NaN or infinite values"):
        load_model(path)
    with pytest.raises(ModelLoadError, match=r"params: tensor 'layers\.1\.wo' holds NaN or infinite values"):
        load_checkpoint(path, shardings=_replicated(loaded.params))


def _replicated(params):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Explicit,))
    return jax.tree_util.tree_map(lambda _: NamedSharding(mesh, PartitionSpec()), params)
