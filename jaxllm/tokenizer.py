"""Tokenizers: Hugging Face tokenizers read from the model directory, the GGUF file or the checkpoint."""

from __future__ import annotations

import os
import sys

from jaxllm.errors import ModelLoadError
from jaxllm.loaders.gguf_tokenizer import load_gguf_tokenizer
from jaxllm.loaders.resolve import ModelSource


# transformers skips its advisory messages (not its warnings or errors) while this environment variable is set
NO_ADVISORY_WARNINGS = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


def load_tokenizer(source: ModelSource):
    path = source.path
    _import_transformers_quietly()
    try:
        if source.kind == "gguf":  # vocabulary, merges and chat template all come from the GGUF metadata
            return load_gguf_tokenizer(path)
        from transformers import AutoTokenizer  # imports torch when it is installed: seconds, GGUF needs none

        directory = path / "tokenizer" if source.kind == "orbax" else path
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except ModelLoadError:
        raise
    except (OSError, ValueError, TypeError, KeyError, IndexError) as e:
        raise ModelLoadError(path, f"cannot load a tokenizer from it: {e}") from e


def _import_transformers_quietly() -> None:
    """Import transformers without its advice that PyTorch was not found: jaxllm takes only tokenizers from it, and
    they need no PyTorch. Advisory messages are off during this import alone; warnings and errors still show."""
    if "transformers" in sys.modules:
        return
    previous = os.environ.get(NO_ADVISORY_WARNINGS)
    os.environ[NO_ADVISORY_WARNINGS] = "1"
    try:
        import transformers  # noqa: F401
    finally:
        if previous is None:
            del os.environ[NO_ADVISORY_WARNINGS]
        else:
            os.environ[NO_ADVISORY_WARNINGS] = previous
