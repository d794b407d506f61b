"""Decide what a model argument names: the default model, a GGUF file, an orbax checkpoint, a Hugging Face
directory, or a Hugging Face model id in the local cache (never downloaded)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from jaxllm.errors import ModelLoadError, ModelNotFoundError
from jaxllm.loaders.default_model import default_model_path

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
ORBAX_MARKER = "jaxllm_checkpoint.json"


@dataclasses.dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf" | "hf_dir" | "orbax"
    path: Path


def resolve_model(model: str | os.PathLike | None) -> ModelSource:
    if model is None:
        return ModelSource("gguf", default_model_path())
    path = Path(model).expanduser()
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise ModelLoadError(path, "pickle checkpoints are refused: unpickling can run arbitrary code; convert the "
                             "model to safetensors or GGUF")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelSource("gguf", path)
        raise ModelLoadError(path, "not a supported model file: give a .gguf file, a Hugging Face model directory "
                             "(config.json + *.safetensors) or a jaxllm orbax checkpoint directory")
    if path.is_dir():
        return _resolve_dir(path)
    if _looks_like_hub_id(str(model)):
        return ModelSource("hf_dir", _from_hf_cache(str(model)))
    raise ModelNotFoundError(path, "no such file or directory")


def _resolve_dir(path: Path) -> ModelSource:
    if (path / ORBAX_MARKER).is_file():
        return ModelSource("orbax", path)
    if (path / "config.json").is_file():
        return ModelSource("hf_dir", path)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource("gguf", ggufs[0])
    if ggufs:
        raise ModelLoadError(path, f"holds {len(ggufs)} .gguf files; name one of them")
    pickles = [p.name for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES]
    why = f" (found pickle checkpoints {pickles}, which are refused: unpickling can run arbitrary code)" \
        if pickles else ""
    raise ModelLoadError(path, f"not a model directory: no config.json, {ORBAX_MARKER} or .gguf file{why}")


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not model.startswith((".", "~"))


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    if "HF_HUB_CACHE" in os.environ:
        return Path(os.environ["HF_HUB_CACHE"])
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return hf_home / "hub"


def _from_hf_cache(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hf_cache_dir()
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as e:
        folder = cache / f"models--{repo_id.replace('/', '--')}"
        raise ModelNotFoundError(repo_id, f"not a local path, and not in the local Hugging Face cache (looked for "
                                 f"{folder}); jaxllm never downloads weights: download them first or pass a "
                                 f"local directory") from e
