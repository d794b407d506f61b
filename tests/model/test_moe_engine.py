"""Each mixture-of-experts family through the engine: greedy tokens over 32 steps equal Hugging Face's with chunked
prefill (a budget of 8 tokens), preemption (a pool too small for both sequences) and a prefix hit (the prompts run
again), nothing compiled after warm-up whatever the routing; expert parallelism over 2 devices through
EngineArgs; what MoE models do not support is refused by name."""

from __future__ import annotations

import pytest

from jaxllm import LLM, SamplingParams
from jaxllm.compile_counter import CompileCounter
from tests.lora.adapters import hf_greedy
from tests.tiny_models import MOE_FAMILIES

PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 190, 33, 2], [200, 1, 2, 3, 4, 120]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def _generate(llm: LLM) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.slow
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_greedy_tokens_equal_hf_through_preemption_and_prefix_hits(family, tiny_model_dir):
    directory, hf_model = tiny_model_dir(family)
    # 15 usable blocks of 4 tokens: each sequence (up to 45 tokens, 12 blocks) fits alone, not both together
    llm = LLM(str(directory), skip_tokenizer=True, max_model_len=48, block_size=4, num_gpu_blocks=16,
              max_num_seqs=4, max_num_batched_tokens=8, warmup=True)
    want = [hf_greedy(hf_model, p, 32) for p in PROMPTS]
    with CompileCounter() as compiles:
        first = _generate(llm)
        second = _generate(llm)
    assert compiles.count == 0, compiles.events
    assert first == want and second == want
    stats = llm.engine.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0, stats


@pytest.mark.slow
def test_expert_parallel_engine_equals_hf(tiny_model_dir):
    directory, hf_model = tiny_model_dir("qwen2_moe")
    llm = LLM(str(directory), skip_tokenizer=True, max_model_len=48, block_size=4, tensor_parallel_size=2,
              enable_expert_parallel=True, attention="reference")
    assert _generate(llm) == [hf_greedy(hf_model, p, 32) for p in PROMPTS]


def test_expert_parallel_of_a_dense_model_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="enable_expert_parallel needs a mixture-of-experts model"):
        LLM(str(tiny_model_dir("llama2")[0]), skip_tokenizer=True, enable_expert_parallel=True)


def test_lora_on_a_moe_model_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="enable_lora is not supported for mixture-of-experts models"):
        LLM(str(tiny_model_dir("mixtral")[0]), skip_tokenizer=True, enable_lora=True)
