"""Orbax checkpoints of converted params: convert once (from GGUF or safetensors), reload fast.

Layout of a checkpoint directory:
    jaxllm_checkpoint.json   {"format_version", "config", "dtype"}
    params/                  the LlamaParams pytree, written by orbax
    tokenizer/               the tokenizer, when one was saved with the params
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxllm.config import Llama3RopeScaling, ModelConfig
from jaxllm.errors import ModelLoadError
from jaxllm.loaders.assemble import numpy_dtype
from jaxllm.loaders.resolve import ORBAX_MARKER
from jaxllm.model.params import LlamaParams, abstract_params, params_dtype
from jaxllm.model.weights import WeightFormat

FORMAT_VERSION = 2  # 2: each layer's arrays apart (1 stacked them on a leading [L] axis)


def save_checkpoint(path: str | Path, config: ModelConfig, params: LlamaParams, tokenizer=None) -> Path:
    path = Path(path).absolute()
    packed = sorted({type(w).__name__ for layer in params.layers for w in vars(layer).values()
                     if isinstance(w, WeightFormat)})
    if packed:
        raise ValueError(f"cannot save {', '.join(packed)} weights: jaxllm checkpoints hold dense weights (keep "
                         "the quantized model's own directory, which loads as fast)")
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path}: refusing to overwrite a non-empty directory")
    dtype = str(params_dtype(params))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / "params", params)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path / "tokenizer"))
    meta = {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(config), "dtype": dtype}
    (path / ORBAX_MARKER).write_text(json.dumps(meta, indent=1))
    return path


def read_checkpoint_config(path: Path) -> tuple[ModelConfig, str]:
    marker = path / ORBAX_MARKER
    try:
        meta = json.loads(marker.read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ModelLoadError(marker, f"format_version {meta.get('format_version')!r} is not "
                                 f"{FORMAT_VERSION}: this checkpoint was written by another jaxllm version (1 "
                                 "stacked the layers); save it again from the original model")
        return _config_from_dict(meta["config"]), meta["dtype"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ModelLoadError(marker, f"not a valid jaxllm checkpoint description ({e!r})") from e


def load_checkpoint(path: Path, dtype: str | None = None, shardings: Any = None) -> tuple[ModelConfig, LlamaParams]:
    """Restore params cast to `dtype` (None: as saved). Without `shardings` they come back as numpy arrays on the
    host, for loaders.place_model to put on their devices (split over a mesh, each device gets only its part: the
    saved ordinary layout is not the tensor-parallel one, so it cannot be read straight into it); `shardings` (a
    LlamaParams of jax.sharding.Sharding) places each array as it is read instead."""
    path = Path(path).absolute()
    config, saved_dtype = read_checkpoint_config(path)
    target = abstract_params(config, numpy_dtype(dtype or saved_dtype))
    if shardings is not None:
        target = jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                        target, shardings)
    try:
        return config, _restore(path / "params", target, to_host=shardings is None)
    except Exception as e:
        raise ModelLoadError(path / "params", f"cannot restore params: {e}") from e


def _restore(path: Path, target: LlamaParams, to_host: bool) -> LlamaParams:
    """The saved pytree with target's dtypes (orbax casts each array as it reads it): numpy arrays (to_host), or
    device arrays with target's shardings."""
    if not to_host:
        with ocp.StandardCheckpointer() as checkpointer:
            return checkpointer.restore(path, target)
    restore_args = jax.tree_util.tree_map(lambda s: ocp.RestoreArgs(restore_type=np.ndarray, dtype=s.dtype), target)
    with ocp.PyTreeCheckpointer() as checkpointer:
        return checkpointer.restore(path, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args))


def _config_from_dict(d: dict) -> ModelConfig:
    d = dict(d)
    if d.get("rope_scaling"):
        d["rope_scaling"] = Llama3RopeScaling(**d["rope_scaling"])
    d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
    return ModelConfig(**d)
