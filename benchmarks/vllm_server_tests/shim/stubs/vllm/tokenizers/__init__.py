"""Stub of vllm.tokenizers: every tokenizer is the default model's (SmolLM2-135M-Instruct), saved by setup as a
Hugging Face directory whose path the shim's conftest puts in JAXLLM_SHIM_TOKENIZER."""
import functools
import os


@functools.lru_cache(maxsize=1)
def _default_model_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.environ["JAXLLM_SHIM_TOKENIZER"])


def get_tokenizer(tokenizer_name=None, *args, **kwargs):
    """Any model id -> the default model's tokenizer (the server serves that model under every name)."""
    return _default_model_tokenizer()
