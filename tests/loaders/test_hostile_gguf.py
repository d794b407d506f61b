"""A GGUF's tokenizer metadata is checked where it is read: a special token id outside the vocabulary is named."""

from __future__ import annotations

import gguf
import pytest

from jaxllm import ModelLoadError
from jaxllm.loaders.resolve import ModelSource
from jaxllm.tokenizer import load_tokenizer


def test_special_token_id_outside_the_vocabulary_is_named(tmp_path):
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<s>", "</s>", "a"])
    writer.add_eos_token_id(7)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"vocab\.gguf: tokenizer\.ggml\.eos_token_id must be an integer in "
                                             r"\[0, 2\], got 7$"):
        load_tokenizer(ModelSource("gguf", path))
