"""Model loading: every source produces the same (ModelConfig, LlamaParams)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax

from jaxllm.config import ModelConfig
from jaxllm.loaders.checkpoint_dtype import auto_dtype
from jaxllm.loaders.gguf import load_gguf
from jaxllm.loaders.orbax import load_checkpoint, save_checkpoint
from jaxllm.loaders.resolve import ModelSource, resolve_model
from jaxllm.loaders.safetensors import load_hf_dir
from jaxllm.model.params import LlamaParams


@dataclasses.dataclass
class LoadedModel:
    config: ModelConfig
    params: LlamaParams
    source: ModelSource


def load_model(model: str | os.PathLike | None = None, dtype: str = "auto") -> LoadedModel:
    """Load `model` (None -> the default model) with params cast to `dtype`.

    dtype: "float32" | "bfloat16" | "float16" | "auto". "auto" is an orbax checkpoint's saved dtype; otherwise,
    on a GPU, the checkpoint's own (auto_dtype), and on any other backend float32, whose matmuls are the fast ones
    on CPU.
    """
    source = resolve_model(model)
    if dtype == "auto" and source.kind != "orbax":
        dtype = auto_dtype(source) if jax.default_backend() == "gpu" else "float32"
    if source.kind == "orbax":
        config, params = load_checkpoint(source.path, None if dtype == "auto" else dtype)
    elif source.kind == "gguf":
        config, params = load_gguf(source.path, dtype)
    else:
        config, params = load_hf_dir(Path(source.path), dtype)
    return LoadedModel(config, params, source)


__all__ = ["LoadedModel", "load_model", "resolve_model", "save_checkpoint", "load_checkpoint", "ModelSource"]
