"""Every EOS id ends a generation (Llama 3 Instruct's <|eot_id|> is listed only in generation_config.json)."""

from __future__ import annotations

import json
import shutil
import types

import pytest

from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.llm import LLM
from jaxllm.sampling_params import SamplingParams

CONFIG_EOS = 2  # config.json's eos_token_id
SECONDARY_EOS = 9  # listed only in generation_config.json
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory):
    model = shutil.copytree(tiny_model_dir("llama2")[0], tmp_path_factory.mktemp("eos") / "model")
    generation = {"bos_token_id": 1, "eos_token_id": [CONFIG_EOS, 7, SECONDARY_EOS]}
    (model / "generation_config.json").write_text(json.dumps(generation))
    return model


def forced(**params) -> SamplingParams:
    """Greedy sampling with the secondary EOS id made the most likely token by far."""
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logit_bias={SECONDARY_EOS: 100.0},
                          detokenize=False, **params)


@pytest.mark.slow
def test_secondary_eos_ids_stop_and_are_masked_before_min_tokens(model_dir):
    llm = LLM(str(model_dir), skip_tokenizer=True, max_model_len=64, block_size=4)
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    params = [forced(), forced(ignore_eos=True), forced(ignore_eos=True, stop_token_ids=[SECONDARY_EOS]),
              forced(min_tokens=3)]
    eos, ignored, stop_id, min_tokens = (r.outputs[0] for r in llm.generate([prompt] * 4, params, use_tqdm=False))
    assert (eos.token_ids, eos.finish_reason, eos.stop_reason) == ([SECONDARY_EOS], "stop", None)
    assert (ignored.token_ids, ignored.finish_reason) == ([SECONDARY_EOS] * MAX_TOKENS, "length")
    assert (stop_id.token_ids, stop_id.finish_reason, stop_id.stop_reason) == ([SECONDARY_EOS], "stop",
                                                                               SECONDARY_EOS)
    # like the primary EOS, it cannot be sampled while fewer than min_tokens tokens were generated
    assert len(min_tokens.token_ids) == 4 and min_tokens.token_ids[-1] == SECONDARY_EOS
    assert SECONDARY_EOS not in min_tokens.token_ids[:3]
    assert (min_tokens.finish_reason, min_tokens.stop_reason) == ("stop", None)


def test_engine_eos_set_puts_the_tokenizers_id_first(model_dir):
    tokenizer = types.SimpleNamespace(eos_token_id=5)  # only its EOS id is read when nothing is detokenized
    engine = LLMEngine(EngineArgs(model=str(model_dir), max_model_len=64, block_size=4), tokenizer=tokenizer)
    assert engine.eos_token_ids == (5, CONFIG_EOS, 7, SECONDARY_EOS)
    assert engine.eos_token_id == 5
    engine.add_request("r", [5, 6, 7], forced())
    assert engine.scheduler.waiting[0].eos_token_ids == engine.eos_token_ids
