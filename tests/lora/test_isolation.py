"""One adapter cannot harm requests that do not use it: the engine's step reads no adapter file (an adapter whose
directory is deleted after its request was added still serves it; one evicted and then deleted fails only the
request that asks for it, when it is added), and a removed adapter's device slot is zeroed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from jaxllm import LLM, LoRARequest, SamplingParams

MAX_RANK = 8
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, detokenize=False)


def engine_with_lora(tiny_model_dir, **options):
    directory, _ = tiny_model_dir("llama3")
    return LLM(str(directory), enable_lora=True, max_lora_rank=MAX_RANK, skip_tokenizer=True, max_model_len=64,
               max_num_seqs=4, **{"max_loras": 1, "max_cpu_loras": 1, **options}).engine


def copy_adapter(peft_adapter, tmp_path, name: str):
    source, _ = peft_adapter("llama3", name, rank=4)
    return str(shutil.copytree(source, tmp_path / name))


def run(engine) -> dict[str, list[int]]:
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished}
    return finals


def test_an_adapter_in_use_is_not_evicted_nor_read_again(tiny_model_dir, peft_adapter, tmp_path):
    """One host-cache entry: adding b's request would evict a's arrays while a's request still waits for its
    slot's write; both directories are gone before the step that writes them."""
    engine = engine_with_lora(tiny_model_dir)
    a, b = copy_adapter(peft_adapter, tmp_path, "a"), copy_adapter(peft_adapter, tmp_path, "b")
    engine.add_request("ra", [1, 2, 3], PARAMS, lora_request=LoRARequest("a", 1, a))
    engine.add_request("rb", [1, 2, 3], PARAMS, lora_request=LoRARequest("b", 2, b))
    shutil.rmtree(a), shutil.rmtree(b)
    assert {k: len(v) for k, v in run(engine).items()} == {"ra": 6, "rb": 6}


def test_an_evicted_adapter_whose_files_are_gone_fails_its_request_alone(tiny_model_dir, peft_adapter, tmp_path):
    engine = engine_with_lora(tiny_model_dir)
    a, b = copy_adapter(peft_adapter, tmp_path, "a"), copy_adapter(peft_adapter, tmp_path, "b")
    engine.add_request("ra", [1, 2, 3], PARAMS, lora_request=LoRARequest("a", 1, a))
    run(engine)
    engine.add_request("rb", [1, 2, 3], PARAMS, lora_request=LoRARequest("b", 2, b))  # evicts a's arrays
    shutil.rmtree(a)
    with pytest.raises(ValueError, match="a"):
        engine.add_request("ra2", [1, 2, 3], PARAMS, lora_request=LoRARequest("a", 1, a))
    engine.add_request("base", [1, 2, 3], PARAMS)
    assert {k: len(v) for k, v in run(engine).items()} == {"rb": 6, "base": 6}  # the engine keeps serving


def test_a_removed_adapters_slot_is_zeroed(tiny_model_dir, peft_adapter, tmp_path):
    engine = engine_with_lora(tiny_model_dir)
    engine.add_request("ra", [1, 2, 3], PARAMS, lora_request=LoRARequest("a", 1, copy_adapter(
        peft_adapter, tmp_path, "a")))
    run(engine)
    slots = engine.runner.lora_slots
    assert any(np.abs(np.asarray(b[0])).sum() > 0 for layer in slots for _, b in layer.values())
    engine.remove_lora(1)
    engine.add_request("base", [1, 2, 3], PARAMS)  # the next step writes the freed slot
    run(engine)
    for layer in engine.runner.lora_slots:
        for a, b in layer.values():
            assert not np.asarray(a[0]).any() and not np.asarray(b[0]).any()
