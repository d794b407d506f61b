"""Beam search on the default model (SmolLM2-135M-Instruct GGUF) equals Hugging Face's generate(num_beams=W) on the
same GGUF (loaded by transformers, dequantized to float32 as jaxllm does): the same W hypotheses in the same
order, with the same scores, for 8 chat prompts whose answers end on EOS at different lengths.
"""

from __future__ import annotations

import pytest
import torch

from jaxllm.beam_search import BeamSearchParams
from jaxllm.chat_renderer import ChatRenderer
from jaxllm.llm import LLM
from tests.hf_beams import hf_beams

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France? Answer in one word.", "Name a primary color.",
             "Say hello in Spanish.", "What is 2 + 2?", "Give me a synonym of 'happy'.",
             "Which planet is closest to the sun?", "Write a haiku about rain.", "Who wrote Hamlet?"]
MAX_TOKENS = 24
# (beam_width, length_penalty, early_stopping): HF's defaults at W = 2 and 4, and another length penalty with
# early stopping on (the tiny model's test covers more settings; HF's beam search takes minutes per setting here)
SETTINGS = [(2, 1.0, False), (4, 1.0, False), (4, 0.5, True)]


@pytest.fixture(scope="module")
def llm():
    return LLM(None, max_model_len=256)


@pytest.fixture(scope="module")
def hf(llm):
    from transformers import AutoModelForCausalLM

    path = llm.engine.loaded.source.path
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(llm):
    renderer = ChatRenderer(llm.get_tokenizer())  # the prompts LLM.chat would run
    return [renderer.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.mark.parametrize("width,length_penalty,early_stopping", SETTINGS)
def test_beam_search_equals_hugging_face(llm, hf, prompts, width, length_penalty, early_stopping):
    eos = llm.engine.eos_token_ids
    assert eos == (2,)  # the one id HF's generate is given below
    params = BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS, length_penalty=length_penalty,
                              early_stopping=early_stopping)
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    stopped = 0
    for prompt, output in zip(prompts, outputs):
        expected = hf_beams(hf, prompt, eos[0], width, MAX_TOKENS, length_penalty, early_stopping)
        assert [s.output_token_ids for s in output.sequences] == [tokens for tokens, _ in expected], \
            llm.get_tokenizer().decode(prompt)
        assert [s.score for s in output.sequences] == pytest.approx([score for _, score in expected], abs=2e-3)
        stopped += sum(s.finish_reason == "stop" for s in output.sequences)
    assert stopped > 0
