"""Every adapter the engine cannot apply is refused with an error naming the file and the problem; nothing is
unpickled; a refused adapter fails only its own request."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxllm import LLM, LoRARequest, SamplingParams
from jaxllm.engine.args import EngineArgs
from jaxllm.lora.manager import AdapterRemovedError
from jaxllm.lora.peft import load_peft_adapter

MAX_RANK = 8


@pytest.fixture
def adapter_copy(peft_adapter, tmp_path):
    """A writable copy of a rank-4 adapter of the tiny llama3 model -> its directory."""
    source, _ = peft_adapter("llama3", "refusals", rank=4, target_modules=("q_proj", "down_proj"))
    target = tmp_path / "adapter"
    shutil.copytree(source, target)
    return target


def edit_config(directory, **changes) -> None:
    path = directory / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_tensors(directory, change) -> None:
    path = directory / "adapter_model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def load(directory, config):
    return load_peft_adapter(str(directory), config, MAX_RANK, np.float32)


@pytest.fixture(scope="module")
def config(tiny_model_dir):
    from jaxllm.loaders import load_model

    return load_model(tiny_model_dir("llama3")[0]).config


def test_the_copy_loads(adapter_copy, config):
    adapter = load(adapter_copy, config)
    assert set(adapter) == {"w_qkv", "wo", "w_gate_up", "w_down"}
    assert not adapter["wo"][0].any() and adapter["w_qkv"][0].any()  # o_proj untargeted: zeros


def test_pickled_weights_are_refused_unopened(adapter_copy, config):
    (adapter_copy / "adapter_model.safetensors").unlink()
    (adapter_copy / "adapter_model.bin").write_bytes(b"not even a pickle: it must never be opened")
    with pytest.raises(ValueError, match=r"adapter_model\.bin: pickled adapter weights are refused"):
        load(adapter_copy, config)


@pytest.mark.parametrize("changes,message", [
    (dict(use_dora=True), r"DoRA \(use_dora\) is not supported"),
    (dict(modules_to_save=["lm_head"]), "modules_to_save"),
    (dict(bias="lora_only"), "bias = 'lora_only' is not supported"),
    (dict(target_modules=["q_proj", "embed_tokens"]), r"target_modules \['embed_tokens'\] are not supported"),
    (dict(peft_type="PREFIX_TUNING"), "peft_type 'PREFIX_TUNING' is not supported"),
    (dict(r=0), "r must be a positive number"),
    (dict(lora_alpha="big"), "lora_alpha must be a positive number"),
], ids=["dora", "modules_to_save", "bias", "unknown_module", "peft_type", "r", "alpha"])
def test_unsupported_configs_are_refused_naming_the_file(adapter_copy, config, changes, message):
    edit_config(adapter_copy, **changes)
    with pytest.raises(ValueError, match=message) as error:
        load(adapter_copy, config)
    assert "adapter_config.json" in str(error.value)


def _rank_16(tensors):
    for name in list(tensors):
        if "lora_A" in name:
            tensors[name] = np.zeros((16, tensors[name].shape[1]), np.float32)
        else:
            tensors[name] = np.zeros((tensors[name].shape[0], 16), np.float32)


@pytest.mark.parametrize("change,message", [
    (_rank_16, "has rank 16, above max_lora_rank 8"),
    (lambda t: t.update({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((4, 65),
                                                                                                   np.float32)}),
     r"tensor 'base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight' has shape \[4, 65\]; the "
     r"base model needs \[r, 64\]"),
    (lambda t: t.update({"base_model.model.lm_head.lora_A.weight": np.zeros((4, 64), np.float32)}),
     "'base_model.model.lm_head.lora_A.weight' is not a LoRA A/B weight of a supported module"),
    (lambda t: t.update({"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector":
                         np.zeros(64, np.float32)}), "lora_magnitude_vector' is not a LoRA A/B weight"),
    (lambda t: t.pop("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"),
     "layer 1 down_proj has no lora_B tensor"),
    (lambda t: t.update({"base_model.model.model.layers.7.mlp.down_proj.lora_A.weight": np.zeros((4, 128),
                                                                                               np.float32)}),
     "is for layer 7, but the base model has 2 layers"),
], ids=["rank", "shape", "lm_head", "dora_magnitude", "missing_b", "layer"])
def test_bad_tensors_are_refused_naming_the_tensor(adapter_copy, config, change, message):
    edit_tensors(adapter_copy, change)
    with pytest.raises(ValueError, match=message) as error:
        load(adapter_copy, config)
    assert "adapter_model.safetensors" in str(error.value)


def test_missing_and_unreadable_files(adapter_copy, config, tmp_path):
    with pytest.raises(ValueError, match="is not a directory"):
        load(tmp_path / "nowhere", config)
    (adapter_copy / "adapter_model.safetensors").write_bytes(b"\x00" * 5)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load(adapter_copy, config)
    (adapter_copy / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json: not readable JSON"):
        load(adapter_copy, config)
    (adapter_copy / "adapter_config.json").unlink()
    with pytest.raises(ValueError, match="has no adapter_config.json"):
        load(adapter_copy, config)


@pytest.mark.parametrize("fields,message", [
    (("", 1, "/p"), "lora_name must be a non-empty string"),
    (("a", 0, "/p"), r"lora_int_id must be an int >= 1 \(0 is the base model\)"),
    (("a", True, "/p"), "lora_int_id must be an int"),
    (("a", 1, ""), "lora_path must be a path"),
])
def test_lora_request_fields_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        LoRARequest(*fields)


@pytest.mark.parametrize("fields,message", [
    (dict(max_loras=0), "max_loras must be >= 1"),
    (dict(max_lora_rank=0), "max_lora_rank must be >= 1"),
    (dict(max_loras=4, max_cpu_loras=2), r"max_cpu_loras \(2\) must be >= max_loras \(4\)"),
])
def test_engine_args_lora_fields_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**fields)


def test_a_refused_adapter_fails_only_its_request(tiny_model_dir, adapter_copy, peft_adapter):
    directory, _ = tiny_model_dir("llama3")
    llm = LLM(str(directory), enable_lora=True, max_loras=2, max_lora_rank=MAX_RANK, skip_tokenizer=True,
              max_model_len=64, max_num_seqs=4)
    good_path, _ = peft_adapter("llama3", "refusals", rank=4, target_modules=("q_proj", "down_proj"))
    good = LoRARequest("good", 1, str(good_path))
    edit_config(adapter_copy, use_dora=True)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with pytest.raises(ValueError, match="DoRA"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 2, params, use_tqdm=False,
                     lora_request=[good, LoRARequest("bad", 2, str(adapter_copy))])
    assert not llm.engine.has_unfinished_requests()  # the good one was withdrawn with the batch
    with pytest.raises(ValueError, match="lora_int_id 1 is already adapter 'good'"):
        llm.engine.add_lora(LoRARequest("other", 1, str(adapter_copy)))
    with pytest.raises(ValueError, match="LoRA name 'good' is already adapter id 1"):
        llm.engine.add_lora(LoRARequest("good", 3, str(good_path)))
    tokens = llm.generate({"prompt_token_ids": [1, 2, 3], "lora_request": good}, params, use_tqdm=False)
    assert len(tokens[0].outputs[0].token_ids) == 4  # the engine goes on serving
    llm.engine.remove_lora(1)
    assert llm.engine.list_loras() == [] and 1 not in llm.engine.lora.registered
    with pytest.raises(ValueError, match="LoRA adapter id 1 was removed"):
        llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False, lora_request=good)
    with pytest.raises(AdapterRemovedError):  # its own kind: a server answers 404 (the model no longer exists)
        llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False, lora_request=good)


def test_a_request_refused_for_itself_reads_no_adapter(tiny_model_dir, adapter_copy):
    """The request's own fields are checked before its adapter's files are read: the refusal names the field, and
    the adapter is not registered."""
    directory, _ = tiny_model_dir("llama3")
    llm = LLM(str(directory), enable_lora=True, max_loras=2, max_lora_rank=MAX_RANK, skip_tokenizer=True,
              max_model_len=64, max_num_seqs=4)
    edit_config(adapter_copy, use_dora=True)  # refused if read
    lora = LoRARequest("unread", 7, str(adapter_copy))
    params = SamplingParams(temperature=0.0, max_tokens=4)
    for prompt, kwargs, message in [([1, 2, 3], dict(priority=1), "priority 1 needs priority scheduling"),
                                    ([1, 2, 10_000_000], {}, "out of vocabulary|vocab"),
                                    ([1, 2, 3], dict(output_kind="bad"), "output_kind must be one of")]:
        with pytest.raises(ValueError, match=message):
            llm.engine.add_request("r", prompt, params, lora_request=lora, **kwargs)
    assert llm.engine.list_loras() == [] and 7 not in llm.engine.lora.registered
    with pytest.raises(ValueError, match="DoRA"):  # a request with nothing else wrong reads it
        llm.engine.add_request("r", [1, 2, 3], params, lora_request=lora)


@pytest.mark.slow
def test_an_adapter_removed_while_in_use_serves_its_running_requests_to_the_end(tiny_model_dir, peft_adapter):
    from tests.lora.adapters import hf_greedy

    directory, _ = tiny_model_dir("llama3")
    path, merged = peft_adapter("llama3", "removed", rank=4)
    llm = LLM(str(directory), enable_lora=True, max_loras=1, max_lora_rank=MAX_RANK, skip_tokenizer=True,
              max_model_len=64, max_num_seqs=4)
    lora = LoRARequest("removed", 5, str(path))
    engine = llm.engine
    engine.add_request("r", [4, 5, 6], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                       lora_request=lora)
    outputs = engine.step()
    engine.remove_lora(5)
    assert engine.list_loras() == [] and 5 in engine.lora.registered  # still used by "r"
    with pytest.raises(ValueError, match="LoRA adapter id 5 was removed"):
        engine.add_lora(lora)
    while engine.has_unfinished_requests():
        outputs = engine.step() or outputs
    assert outputs[0].outputs[0].token_ids == hf_greedy(merged, [4, 5, 6], 10)
    assert 5 not in engine.lora.registered and engine.lora.slots == {}
    engine.add_lora(LoRARequest("removed", 6, str(path)))  # the name is free again; a new id
    assert [r.lora_int_id for r in engine.list_loras()] == [6]
