"""Packages only some features need, imported when that feature is used.

The engine, the model, the safetensors and orbax loaders and the kernels need none of them, so a machine without
`gguf` (reading GGUF files) or `fastapi` / `uvicorn` (the HTTP server) still runs everything else; the feature
that needs one says which package is missing and how to install it, when it is used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# the features, as the errors name them
GGUF = "decoding a GGUF k-quant tensor (Q4_K, Q6_K)"  # gguf: loaders/gguf_dequant.py
SERVER = "the OpenAI-compatible server (jaxllm serve)"  # fastapi (with starlette), uvicorn: entrypoints/openai
STRUCTURED_OUTPUTS = "structured outputs (JSON schema, regex, choice, grammar)"  # xgrammar: structured_outputs/


class MissingDependencyError(ImportError):
    """A feature was used whose package is not installed; the message names the package and the pip command."""


def require(module: str, purpose: str, pip_name: str | None = None) -> ModuleType:
    """import `module`, or raise MissingDependencyError: "<purpose> needs the `<module>` package: pip install ...".

    The error it replaces is kept in the message (and as __cause__): an installed package that fails to import
    (a dependency of its own missing) says so instead of looking absent.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(f"{purpose} needs the `{module}` package: pip install {pip_name or module} "
                                     f"({type(e).__name__}: {e})", name=module) from e
