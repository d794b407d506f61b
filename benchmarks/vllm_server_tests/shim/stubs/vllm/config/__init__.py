"""Stub of vllm.config: ModelConfig answers only get_vocab_size(); MultiModalConfig is a vLLM-internal stub."""
from vllm import make_stub

MultiModalConfig = make_stub("vllm.config.MultiModalConfig")


class ModelConfig:
    """Tests build logit_bias / logprobs limits from the vocabulary size: that of the default model."""

    def __init__(self, *args, **kwargs):
        pass

    def get_vocab_size(self) -> int:
        from vllm.tokenizers import get_tokenizer

        return len(get_tokenizer())
