"""The tokenizer stored in a GGUF file, built without PyTorch.

transformers converts GGUF vocabularies to fast tokenizers with code that needs no torch, but its GGUF metadata
reader imports torch; the metadata is read here (gguf_file) instead and handed to that converter as Python lists.
tests/loaders/test_gguf_tokenizer.py checks the result against AutoTokenizer.from_pretrained(gguf_file=...).

The conversion takes about a second; its result is saved (save_pretrained) under $JAXLLM_CACHE_DIR/tokenizers in
a directory named by the file (its path, size and modification time) and the transformers and tokenizers versions,
and later starts load that (a fifth of the time). A file that changes gets a new directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from jaxllm.file_fields import FieldReader
from jaxllm.loaders.gguf import open_gguf
from pallas_kernels.native_build import cache_root

SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                     "pad_token": "padding_token_id"}


def load_gguf_tokenizer(path: Path):
    """The file's tokenizer: from the cache when this file was converted before, else converted (and cached)."""
    from transformers import PreTrainedTokenizerFast

    cached = _cache_path(path)
    if cached.is_dir():
        return PreTrainedTokenizerFast.from_pretrained(str(cached), local_files_only=True)
    tokenizer = convert_gguf_file_tokenizer(path)
    _save(tokenizer, cached)
    return tokenizer


def _cache_path(path: Path) -> Path:
    import tokenizers
    import transformers

    stat = path.stat()
    key = "\n".join([str(path.resolve()), str(stat.st_size), str(stat.st_mtime_ns), transformers.__version__,
                     tokenizers.__version__])
    return cache_root() / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:20]


def _save(tokenizer, target: Path) -> None:
    """save_pretrained into a temporary directory renamed into place: a reader never sees half a tokenizer."""
    staging = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(dir=target.parent, prefix=".staging-")
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    except OSError:  # a read-only cache, or a concurrent start that saved it first: this tokenizer still serves
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def convert_gguf_file_tokenizer(path: Path):
    """The tokenizer built from the file's metadata by transformers' GGUF converter."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    reader = open_gguf(path)
    metadata = {key: value.tolist() if hasattr(value, "tolist") else value for key, value in reader.metadata.items()
                if key.startswith("tokenizer.") or key == "general.architecture"}
    grouped = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                       if f"tokenizer.{key}" in metadata}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer_dict, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":  # sentencepiece vocabularies add BOS unless told not to
        config.setdefault("add_bos_token", True)
    tokens = tokenizer_dict["tokens"]
    special = FieldReader(reader.metadata, path)
    for name, key in SPECIAL_TOKEN_IDS.items():  # ids checked against the vocabulary they index
        token_id = special.integer(f"tokenizer.ggml.{key}", None, minimum=0, maximum=len(tokens) - 1)
        config[name] = tokens[token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
