"""The torch-free GGUF tokenizer equals transformers' own GGUF tokenizer on the default model."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from jaxllm.loaders import resolve_model
from jaxllm.loaders.gguf_tokenizer import load_gguf_tokenizer

pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is", "Hello  world\n\tdef f(x): return x**2  # 😀 naïve 日本語",
         "<|im_start|>user\nHi<|im_end|>\n", " leading space and trailing ", ""]


def test_matches_transformers_gguf_tokenizer():
    path = resolve_model(None).path
    ours = load_gguf_tokenizer(path)
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = ref.encode(text)
        assert ours.encode(text) == ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id) == \
        (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id, ref.unk_token_id)
    assert ours.all_special_ids == ref.all_special_ids and len(ours) == len(ref)
