"""The tokenizer stored in a GGUF file, built without PyTorch.

transformers converts GGUF vocabularies to fast tokenizers with code that needs no torch, but its GGUF metadata
reader imports torch; the metadata is read here with the `gguf` package instead and handed to that converter.
tests/loaders/test_gguf_tokenizer.py checks the result against AutoTokenizer.from_pretrained(gguf_file=...).
"""

from __future__ import annotations

from pathlib import Path

from jaxllm.loaders.gguf import gguf_metadata, open_gguf

SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                     "pad_token": "padding_token_id"}


def load_gguf_tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    reader = open_gguf(path)
    metadata = {key: field.contents() for key, field in reader.fields.items()
                if key.startswith("tokenizer.") or key == "general.architecture"}
    grouped = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                       if f"tokenizer.{key}" in metadata}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer_dict, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":  # sentencepiece vocabularies add BOS unless told not to
        config.setdefault("add_bos_token", True)
    tokens = tokenizer_dict["tokens"]
    special = gguf_metadata(reader, path)
    for name, key in SPECIAL_TOKEN_IDS.items():  # ids checked against the vocabulary they index
        token_id = special.integer(f"tokenizer.ggml.{key}", None, minimum=0, maximum=len(tokens) - 1)
        config[name] = tokens[token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
