"""Each new family through the engine: greedy tokens over 32 steps equal Hugging Face's (chunked prefill with a
small token budget, contexts past the window), and after warm-up nothing compiles."""

from __future__ import annotations

import pytest

from jaxllm import LLM, SamplingParams
from jaxllm.compile_counter import CompileCounter
from tests.lora.adapters import hf_greedy
from tests.tiny_models import NEW_FAMILIES

PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 190, 33, 2], [200, 1, 2, 3, 4, 120]]


@pytest.mark.slow
@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_greedy_tokens_equal_hf_and_nothing_compiles_after_warmup(family, tiny_model_dir):
    directory, hf_model = tiny_model_dir(family)
    # the default attention (on CPU the native kernel); a budget of 8 tokens chunks the 13-token prompt
    llm = LLM(str(directory), skip_tokenizer=True, max_model_len=64, block_size=4,
              max_num_seqs=4, max_num_batched_tokens=8, warmup=True)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    with CompileCounter() as compiles:
        got = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert compiles.count == 0, compiles.events
    for output, prompt in zip(got, PROMPTS):
        assert output.outputs[0].token_ids == hf_greedy(hf_model, prompt, 32)
