"""A Hugging Face directory whose config.json or index is hostile is refused by a ModelLoadError naming the file,
the field and the problem: never a raw traceback, and never a file outside the model directory read."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.numpy import load_file, save_file

from jaxllm import ModelLoadError, load_model


@pytest.fixture
def model(tiny_model_dir, tmp_path):
    """A writable copy of the tiny Llama 3 model (rope scaling included) -> its directory."""
    return shutil.copytree(tiny_model_dir("llama3")[0], tmp_path / "model")


def edit_config(model, **changes):
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, message", [
    (dict(num_attention_heads=0), r"num_attention_heads must be an integer in \[1, \d+\], got 0"),
    (dict(num_attention_heads="4"), r"num_attention_heads must be an integer .* got '4'"),
    (dict(num_key_value_heads=3), r"ModelConfig\.num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
    (dict(hidden_size=2.5), r"hidden_size must be an integer .* got 2\.5"),
    (dict(max_position_embeddings=2**40), r"max_position_embeddings must be an integer in \[1, 2147483647\]"),
    (dict(rope_scaling={"rope_type": "llama3"}), r"missing required field 'rope_scaling\.low_freq_factor'"),
    (dict(rope_scaling="llama3"), r"rope_scaling must be an object, got 'llama3'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 32}),
     r"rope_scaling\.high_freq_factor must be above low_freq_factor"),
    (dict(rope_scaling={"rope_type": "yarn"}), r"rope_scaling\.original_max_position_embeddings is required"),
    (dict(rope_scaling={"rope_type": "ntk-by-parts"}), r"rope_scaling\.rope_type 'ntk-by-parts' is not supported"),
    (dict(architectures=[["LlamaForCausalLM"]]), r"architectures must be a list of strings"),
    (dict(architectures="LlamaForCausalLM"), r"architectures must be a list of strings"),
    (dict(rms_norm_eps=float("nan")), r"rms_norm_eps must be a positive number <= 1 \(finite\), got nan"),
    (dict(rope_theta=float("inf")), r"rope_theta must be a positive number \(finite\), got inf"),
    (dict(rope_theta=-1.0), r"rope_theta must be a positive number \(finite\), got -1\.0"),
    (dict(tie_word_embeddings="false"), r"tie_word_embeddings must be true or false, got 'false'"),
    (dict(eos_token_id=[[2]]), r"eos_token_id must be a token id or a list of token ids"),
    (dict(bos_token_id=-1), r"bos_token_id must be an integer in \[0, \d+\], got -1"),
    (dict(hidden_act=["silu"]), r"hidden_act must be a string"),
    (dict(vocab_size="x" * 10_000), r"vocab_size must be an integer .* got 'x{20,60}\.\.\.x*'$"),
], ids=lambda v: None if isinstance(v, dict) else "")
def test_bad_config_field_is_named(model, changes, message):
    edit_config(model, **changes)
    with pytest.raises(ModelLoadError, match=r"config\.json: " + message) as raised:
        load_model(model)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 400


@pytest.mark.parametrize("text, message", [
    (b"\xff\xfe not text", r"not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, r"not valid JSON"),
    (b"[1, 2]", r"must hold a JSON object, got list"),
], ids=["not-utf8", "nested-too-deep", "a-list"])
def test_config_that_is_no_json_object_is_named(model, text, message):
    (model / "config.json").write_bytes(text)
    with pytest.raises(ModelLoadError, match=r"config\.json: " + message):
        load_model(model)


def _shard(model, weight_map):
    """Split the weights into an index naming `weight_map` (tensor name -> file name)."""
    tensors = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    save_file(tensors, model / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": weight_map(sorted(tensors))}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))


def test_index_weight_map_that_is_a_list_is_named(model):
    _shard(model, lambda names: [[n, "model-00001-of-00001.safetensors"] for n in names])
    with pytest.raises(ModelLoadError, match=r"index\.json: weight_map must be an object of tensor name -> "
                                             r"file name, got \[\["):
        load_model(model)


@pytest.mark.parametrize("outside", ["../elsewhere.safetensors", "/{tmp}/elsewhere.safetensors",
                                     "sub/../../elsewhere.safetensors", "config.json"])
def test_index_shards_outside_the_model_directory_are_refused_unread(model, tmp_path, outside, monkeypatch):
    shutil.copy(model / "model.safetensors", tmp_path / "elsewhere.safetensors")
    name = outside.format(tmp=str(tmp_path).lstrip("/"))
    opened = []
    monkeypatch.setattr("jaxllm.loaders.safetensors.safe_open", lambda *a, **k: opened.append(a) or 1 / 0)
    _shard(model, lambda names: {n: name for n in names})
    with pytest.raises(ModelLoadError, match=r"index\.json: weight_map names .*: a shard must be a \.safetensors "
                                             r"file inside the model directory"):
        load_model(model)
    assert not opened


def test_a_model_claiming_an_absurd_context_serves_within_its_kv_cache(model):
    from jaxllm import LLM, SamplingParams

    edit_config(model, max_position_embeddings=2**31 - 1)
    llm = LLM(str(model), skip_tokenizer=True, max_num_seqs=2, max_num_batched_tokens=16,
              kv_cache_memory_bytes=1 << 20, block_size=16)
    blocks = llm.engine.cache_config.num_blocks
    assert llm.engine.scheduler_config.max_model_len == (blocks - 1) * 16 < 2**16
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=3, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
