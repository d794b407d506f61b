"""Hugging Face directories, the local hub cache, and a clear error for every kind of bad model input."""

from __future__ import annotations

import json
import pickle
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxllm import ModelLoadError, ModelNotFoundError, load_model


def _copy(tiny_model_dir, tmp_path, variant="llama2"):
    directory, _ = tiny_model_dir(variant)
    return shutil.copytree(directory, tmp_path / "model")


def _params_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_sharded_safetensors_index(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path)
    tensors = load_file(model / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, model / shard)
    (model / "model.safetensors").unlink()
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _params_equal(load_model(model).params, load_model(tiny_model_dir("llama2")[0]).params)


def test_missing_shard_is_named(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(ModelLoadError, match=r"gone\.safetensors: missing weight shard"):
        load_model(model)


def test_model_id_from_local_hf_cache(tiny_model_dir, tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model_dir("llama2")[0], snapshot)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = load_model("acme/tiny")
    assert loaded.source.path == snapshot
    _params_equal(loaded.params, load_model(tiny_model_dir("llama2")[0]).params)


def test_model_id_absent_from_cache_names_what_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotFoundError, match=r"acme/absent.*models--acme--absent.*never downloads"):
        load_model("acme/absent")


def test_missing_path():
    with pytest.raises(ModelNotFoundError, match=r"/no/such/model: no such file or directory"):
        load_model("/no/such/model")


def test_missing_config_json(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path)
    (model / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"model: not a model directory"):
        load_model(model)


def test_truncated_safetensors(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: cannot read safetensors file \(truncated"):
        load_model(model)


def test_unknown_architecture(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"config\.json: unknown architecture \['GPT2LMHeadModel'\]"):
        load_model(model)


def test_config_weight_shape_mismatch(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["intermediate_size"] = 100
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"tensor 'model\.layers\.\d\.mlp\.\w+_proj\.weight' has shape "
                                             r"\(\d+, \d+\), but the config implies \((100, 64|64, 100)\)"):
        load_model(model)


def test_missing_tensor_is_named(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path)
    tensors = load_file(model / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, model / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensors: layer 1 w_up"):
        load_model(model)


class _Exploit:
    def __reduce__(self):
        return (open, ("UNPICKLED", "w"))


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth"])
def test_pickle_checkpoints_are_refused_and_never_unpickled(name, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _copy(tiny_model_dir, tmp_path)
    (model / "model.safetensors").unlink()
    (model / name).write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(ModelLoadError, match=r"pickle.*refused.*arbitrary code"):
        load_model(model)
    with pytest.raises(ModelLoadError, match=rf"{name}: pickle checkpoints are refused"):
        load_model(model / name)
    assert not (tmp_path / "UNPICKLED").exists()


def test_unknown_dtype_is_named(tiny_model_dir):
    with pytest.raises(ValueError, match=r"dtype must be one of .*'float8'"):
        load_model(tiny_model_dir("llama2")[0], dtype="float8")
