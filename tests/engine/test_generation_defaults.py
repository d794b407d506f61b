"""The offline API's defaults from the generation config: LLM.get_default_sampling_params, and generate / chat
without sampling params (vLLM's LLM)."""

from __future__ import annotations

import json
import shutil

import pytest

from jaxllm import LLM, SamplingParams

ENGINE = dict(skip_tokenizer=True, max_model_len=64, block_size=4, max_num_seqs=2)
PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def model_with_generation_config(tiny_model_dir, tmp_path_factory):
    """The tiny Llama with a generation_config.json setting greedy decoding, 3 new tokens, a repetition penalty."""
    model = shutil.copytree(tiny_model_dir("llama2")[0], tmp_path_factory.mktemp("generation-config") / "model")
    (model / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.0, "max_new_tokens": 3,
         "repetition_penalty": 1.2}))
    return model


def test_generate_without_params_takes_the_generation_config_and_the_override(model_with_generation_config):
    llm = LLM(str(model_with_generation_config), override_generation_config={"max_new_tokens": 2}, **ENGINE)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.repetition_penalty, defaults.max_tokens) == (0.0, 1.2, 2)
    assert SamplingParams(temperature=0.0, repetition_penalty=1.2, max_tokens=2) == defaults
    given = SamplingParams(temperature=0.0, repetition_penalty=1.2, max_tokens=2)
    unset, = llm.generate([PROMPT], use_tqdm=False)
    explicit, = llm.generate([PROMPT], given, use_tqdm=False)
    assert unset.outputs[0].token_ids == explicit.outputs[0].token_ids
    assert len(unset.outputs[0].token_ids) == 2 and unset.outputs[0].finish_reason == "length"


def test_vllm_gives_the_plain_defaults(model_with_generation_config):
    llm = LLM(str(model_with_generation_config), generation_config="vllm", **ENGINE)
    assert llm.get_default_sampling_params() == SamplingParams()


def test_chat_without_params_takes_the_generation_config(tiny_model_with_tokenizer, tmp_path):
    model = shutil.copytree(tiny_model_with_tokenizer, tmp_path / "model")
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 3}))
    llm = LLM(str(model), max_model_len=256, max_num_seqs=1)
    conversation = [{"role": "user", "content": "Hello"}]
    unset, = llm.chat(conversation, use_tqdm=False)
    explicit, = llm.chat(conversation, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert unset.outputs[0].token_ids == explicit.outputs[0].token_ids and len(unset.outputs[0].token_ids) == 3
