"""Orbax checkpoints: save converted params once, restore them (optionally straight into a sharding)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxllm import ModelLoadError, load_model
from jaxllm.loaders import load_checkpoint, save_checkpoint


# rope scalings of each kind, biases, q/k norms, post-norms, windows, soft-caps, two rope bases and experts (a
# shared expert, a dense layer among sparse ones) survive it
@pytest.mark.parametrize("ckpt_variant", ["llama3", "qwen2", "gemma3", "gemma2", "phi3", "qwen2_yarn", "qwen2_moe",
                                         "qwen3_moe"])
def test_round_trip(ckpt_variant, tiny_model_dir, tmp_path):
    original = load_model(tiny_model_dir(ckpt_variant)[0], dtype="bfloat16")
    save_checkpoint(tmp_path / "ckpt", original.config, original.params)
    restored = load_model(tmp_path / "ckpt")
    assert restored.config == original.config
    assert restored.source.kind == "orbax"
    for a, b in zip(jax.tree_util.tree_leaves(restored.params), jax.tree_util.tree_leaves(original.params),
                    strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restore_with_target_sharding(tiny_model_dir, tmp_path):
    original = load_model(tiny_model_dir("llama2")[0])
    save_checkpoint(tmp_path / "ckpt", original.config, original.params)
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Explicit,))
    sharding = NamedSharding(mesh, PartitionSpec())
    shardings = jax.tree_util.tree_map(lambda _: sharding, original.params)
    _, params = load_checkpoint(tmp_path / "ckpt", shardings=shardings)
    assert all(x.sharding == sharding for x in jax.tree_util.tree_leaves(params))


def test_refuses_to_overwrite(tiny_model_dir, tmp_path):
    original = load_model(tiny_model_dir("llama2")[0])
    save_checkpoint(tmp_path / "ckpt", original.config, original.params)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        save_checkpoint(tmp_path / "ckpt", original.config, original.params)


def test_corrupt_description_is_named(tiny_model_dir, tmp_path):
    original = load_model(tiny_model_dir("llama2")[0])
    save_checkpoint(tmp_path / "ckpt", original.config, original.params)
    (tmp_path / "ckpt" / "jaxllm_checkpoint.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"jaxllm_checkpoint\.json: not a valid jaxllm checkpoint"):
        load_model(tmp_path / "ckpt")
