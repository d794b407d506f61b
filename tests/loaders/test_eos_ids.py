"""Every end-of-sequence id a model declares reaches ModelConfig.eos_token_ids, the primary (config) one first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest

from jaxllm import ModelLoadError, load_model
from jaxllm.loaders import save_checkpoint
from jaxllm.loaders.gguf import gguf_config, open_gguf

# As Llama 3 Instruct: config.json names one EOS id, generation_config.json lists the end-of-turn ids too.
GENERATION_EOS = [128, 2, 200]


def _with_generation_eos(tiny_model_dir, tmp_path, eos_token_id) -> Path:
    model = shutil.copytree(tiny_model_dir("llama2")[0], tmp_path / "model")
    (model / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": eos_token_id}))
    return model


def test_generation_config_eos_ids_join_the_config_ones(tiny_model_dir, tmp_path):
    model = _with_generation_eos(tiny_model_dir, tmp_path, GENERATION_EOS)
    assert json.loads((model / "config.json").read_text())["eos_token_id"] == 2
    assert load_model(model).config.eos_token_ids == (2, 128, 200)


def test_generation_config_single_eos_id_and_list_in_config(tiny_model_dir, tmp_path):
    model = _with_generation_eos(tiny_model_dir, tmp_path, 77)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "eos_token_id": [5, 2]}))
    assert load_model(model).config.eos_token_ids == (5, 2, 77)


def test_bad_generation_config_is_named(tiny_model_dir, tmp_path):
    model = _with_generation_eos(tiny_model_dir, tmp_path, ["x"])
    with pytest.raises(ModelLoadError, match=r"generation_config\.json: .*eos_token_ids must be token ids"):
        load_model(model)
    (model / "generation_config.json").write_text("{oops")
    with pytest.raises(ModelLoadError, match=r"generation_config\.json: not valid JSON"):
        load_model(model)


def test_orbax_checkpoint_keeps_every_eos_id(tiny_model_dir, tmp_path):
    original = load_model(_with_generation_eos(tiny_model_dir, tmp_path, GENERATION_EOS))
    save_checkpoint(tmp_path / "ckpt", original.config, original.params)
    assert load_model(tmp_path / "ckpt").config.eos_token_ids == (2, 128, 200)


def _metadata_only_gguf(path, **token_ids):
    """A GGUF holding a tiny Llama's metadata and no tensors (enough for gguf_config)."""
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(256)
    for kind, token_id in token_ids.items():
        getattr(writer, f"add_{kind}_token_id")(token_id)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("token_ids, expected", [
    (dict(eos=2, eot=7), (2, 7)),
    (dict(eos=2, eot=7, eom=9), (2, 7, 9)),
    (dict(eos=2, eot=2), (2,)),
    (dict(eot=7), (7,)),
    (dict(), ()),
], ids=["eot", "eot-and-eom", "eot-is-eos", "eot-only", "none"])
def test_gguf_end_of_turn_ids_are_eos_ids(token_ids, expected, tmp_path):
    path = _metadata_only_gguf(tmp_path / "m.gguf", **token_ids)
    assert gguf_config(open_gguf(path), path).eos_token_ids == expected
