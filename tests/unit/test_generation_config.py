"""The generation config's default sampling values (vLLM's --generation-config, --override-generation-config):
auto reads the model's, vllm none, a folder its own file; the override wins; bad input is named."""

from __future__ import annotations

import json
import logging
import re

import gguf
import pytest

from jaxllm.engine.generation_config import check_override, override_from_json, sampling_defaults
from jaxllm.errors import ModelLoadError
from jaxllm.loaders.resolve import ModelSource

# As Qwen2.5-Instruct's, with every field vLLM takes and some it does not
MODEL_FILE = {"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "temperature": 0.7, "top_p": 0.8,
              "top_k": 20, "repetition_penalty": 1.05, "min_p": 0.1, "max_new_tokens": 64, "max_length": 512}
MODEL_DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "min_p": 0.1,
                  "max_tokens": 64}


def _folder(path, values) -> ModelSource:
    path.mkdir(parents=True, exist_ok=True)
    (path / "generation_config.json").write_text(json.dumps(values))
    return ModelSource("hf_dir", path)


def test_auto_takes_the_models_sampling_fields_and_nothing_else(tmp_path):
    assert sampling_defaults("auto", None, _folder(tmp_path, MODEL_FILE)) == MODEL_DEFAULTS


def test_a_model_without_a_generation_config_gives_none(tmp_path):
    assert sampling_defaults("auto", None, ModelSource("hf_dir", tmp_path)) == {}
    assert sampling_defaults("auto", None, _folder(tmp_path, {"bos_token_id": 1, "eos_token_id": 2})) == {}
    assert sampling_defaults("auto", None, None) == {}  # params made in memory


def test_vllm_ignores_the_models_file(tmp_path):
    assert sampling_defaults("vllm", None, _folder(tmp_path, MODEL_FILE)) == {}


def test_a_folder_is_read_instead_of_the_model(tmp_path):
    model = _folder(tmp_path / "model", MODEL_FILE)
    other = _folder(tmp_path / "other", {"temperature": 0.2, "max_new_tokens": 5}).path
    assert sampling_defaults(str(other), None, model) == {"temperature": 0.2, "max_tokens": 5}


def test_the_override_replaces_adds_and_removes(tmp_path):
    model = _folder(tmp_path, {"temperature": 0.7, "top_p": 0.8})
    override = {"temperature": 0.5, "max_new_tokens": 9, "top_p": None}
    assert sampling_defaults("auto", override, model) == {"temperature": 0.5, "max_tokens": 9}
    assert sampling_defaults("vllm", {"top_k": 3}, model) == {"top_k": 3}  # vLLM applies it over "vllm" too


def test_a_missing_folder_is_named(tmp_path):
    missing = tmp_path / "nowhere" / "generation_config.json"
    with pytest.raises(ModelLoadError, match=re.escape(f"{missing}: not found: generation_config takes 'auto'")):
        sampling_defaults(str(tmp_path / "nowhere"), None, None)


def test_a_malformed_file_is_named_with_the_key(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    path = folder / "generation_config.json"
    path.write_text("{oops")
    with pytest.raises(ModelLoadError, match=re.escape(f"{path}: not valid JSON")):
        sampling_defaults(str(folder), None, None)
    path.write_text(json.dumps({"temperature": -1}))
    with pytest.raises(ModelLoadError, match=re.escape(f"{path}: temperature must be a number >= 0")):
        sampling_defaults(str(folder), None, None)
    path.write_text(json.dumps({"top_k": 2.5}))  # the model's own file, read by auto, is checked alike
    with pytest.raises(ModelLoadError, match=re.escape(f"{path}: top_k must be an integer")):
        sampling_defaults("auto", None, ModelSource("hf_dir", folder))


def test_a_gguf_gives_its_llama_cpp_sampling_metadata(tmp_path):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_float32("general.sampling.temp", 0.7)
    writer.add_int32("general.sampling.top_k", 40)
    writer.add_float32("general.sampling.penalty_repeat", 1.3)  # over the last n tokens only: not taken
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert sampling_defaults("auto", None, ModelSource("gguf", path)) == {"temperature": 0.7, "top_k": 40}


def test_the_defaults_are_logged_once_with_their_source(tmp_path, caplog):
    model = _folder(tmp_path, {"temperature": 0.7})
    with caplog.at_level(logging.INFO, logger="jaxllm"):
        sampling_defaults("auto", {"top_k": 3}, model)
        sampling_defaults("vllm", None, model)
    records = [r for r in caplog.records if r.name == "jaxllm.engine.generation_config"]
    assert len(records) == 1
    message = records[0].getMessage()
    assert str(tmp_path / "generation_config.json") in message and "override_generation_config" in message
    assert "temperature=0.7, top_k=3" in message


@pytest.mark.parametrize("override, message", [
    ({"temp": 0.5}, r"unknown key 'temp' \(known: repetition_penalty, temperature, top_k, top_p, min_p, "
                    r"max_new_tokens\)"),
    ({"max_tokens": 5}, "unknown key 'max_tokens' .*; max_new_tokens sets max_tokens"),
    ({"top_p": 2}, "top_p must be a positive number <= 1"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer in"),
    ([1], "must be a JSON object"),
])
def test_a_bad_override_names_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        check_override(override)


def test_the_flag_value_is_a_json_object():
    assert override_from_json('{"temperature": 0.5}') == {"temperature": 0.5}
    with pytest.raises(ValueError, match="not JSON"):
        override_from_json("{temperature: 0.5}")
