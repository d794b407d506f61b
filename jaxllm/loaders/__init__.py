"""Model loading: every source produces the same (ModelConfig, LlamaParams).

Two halves: a loader reads its files into numpy params on the host (load_host_model), then place_model puts them on
one device or splits them over a tensor-parallel mesh, each device receiving only its own part.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

from jax.sharding import Mesh

from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError
from jaxllm.loaders.awq import check_quantization_name
from jaxllm.loaders.checkpoint_dtype import auto_dtype
from jaxllm.loaders.cpu_dtype import cpu_auto_dtype
from jaxllm.model.host_arrays import small_pages
from jaxllm.loaders.gguf import load_gguf
from jaxllm.loaders.orbax import load_checkpoint, save_checkpoint
from jaxllm.loaders.resolve import ModelSource, resolve_model
from jaxllm.loaders.safetensors import load_hf_dir
from jaxllm.model import tensor_parallel
from jaxllm.model.kernels import on_gpu
from jaxllm.model.params import LlamaParams


@dataclasses.dataclass
class LoadedModel:
    config: ModelConfig
    params: LlamaParams
    source: ModelSource


def load_model(model: str | os.PathLike | None = None, dtype: str = "auto", mesh: Mesh | None = None,
               on_placed: Callable[[str], None] | None = None, quantization: str | None = None) -> LoadedModel:
    """Load `model` (None -> the default model) with params cast to `dtype`, on one device or split over `mesh`.

    dtype: "float32" | "bfloat16" | "float16" | "auto". "auto" is an orbax checkpoint's saved dtype; otherwise,
    on a GPU, the checkpoint's own (auto_dtype), and on a CPU the dtype whose matmuls are the faster ones there
    (cpu_dtype.cpu_auto_dtype: bfloat16 with AMX or AVX512-BF16, else float32). mesh: a tensor_parallel.make_mesh mesh; each
    device receives only its own part of the params.
    on_placed(path) runs after each array is placed on its devices.
    quantization: None loads what the checkpoint holds (an AutoAWQ directory's linears stay packed int4: its
    config.json says so); "awq" also insists that it is one (awq.QUANTIZATION_METHODS).
    """
    return place_model(load_host_model(model, dtype, quantization), mesh, on_placed)


def load_host_model(model: str | os.PathLike | None = None, dtype: str = "auto",
                    quantization: str | None = None, as_tiles: bool = False) -> LoadedModel:
    """load_model's first half: the params as numpy arrays on the host, each tensor cast to `dtype` as it is read
    (packed weights keep their own dtypes). as_tiles: the LM head and the layers' dense bfloat16 linears stored as
    AMX tiles as they are read (model/tiled_params; an orbax checkpoint's are not, tile_params packs them later)."""
    with small_pages():
        return _load_host_model(model, dtype, quantization, as_tiles)


def _load_host_model(model, dtype: str, quantization: str | None, as_tiles: bool) -> LoadedModel:
    check_quantization_name(quantization)
    source = resolve_model(model)
    if quantization is not None and source.kind != "hf_dir":
        raise ModelLoadError(source.path, f"quantization={quantization!r} reads AutoAWQ checkpoints, which are "
                             f"Hugging Face directories; this is a {source.kind} model")
    if dtype == "auto" and source.kind != "orbax":
        dtype = auto_dtype(source) if on_gpu() else cpu_auto_dtype()
    if source.kind == "orbax":
        config, params = load_checkpoint(source.path, None if dtype == "auto" else dtype)
    elif source.kind == "gguf":
        config, params = load_gguf(source.path, dtype, as_tiles)
    else:
        config, params = load_hf_dir(Path(source.path), dtype, quantization, as_tiles)
    return LoadedModel(config, params, source)


def place_model(loaded: LoadedModel, mesh: Mesh | None = None,
                on_placed: Callable[[str], None] | None = None) -> LoadedModel:
    """load_model's second half: `loaded` (host params, or device params in the ordinary layout, which are
    fetched to the host first when split) on the default device, or split over `mesh` (ValueError if the model
    cannot be split over its size) by tensor_parallel.shard_params, each device receiving only its own slice."""
    mesh = mesh or tensor_parallel.default_mesh()
    tensor_parallel.check_tp_size(loaded.config, mesh.size, mesh.size)
    params = tensor_parallel.shard_params(loaded.params, loaded.config, mesh, on_placed)
    return dataclasses.replace(loaded, params=params)


__all__ = ["LoadedModel", "load_model", "load_host_model", "place_model", "resolve_model", "save_checkpoint",
           "load_checkpoint", "ModelSource"]
