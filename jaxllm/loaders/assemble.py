"""Turn a loader's named numpy tensors into host LlamaParams, checking every shape against the config.

Loaders map their own tensor names to (field, layer) pairs: field is a LlamaParams field or a checkpoint layer
field (params.checkpoint_layer_shapes: q/k/v and gate/up apart, fused here after the checks), layer is the layer
index or None for a global tensor; each layer's tensors become that layer's own arrays. One place reports missing,
duplicate and mis-shaped tensors. Each tensor is cast to the target dtype as it arrives, into aligned memory
(model/host_arrays: a CPU device uses it in place); a packed weight format (weights.WeightFormat) keeps its own
dtypes, its shape checked as the dense weight's it stands for. The params stay numpy, on the host, until
loaders.place_model puts them on their devices (each device only its own part when they are split over a mesh).
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

import jax
import ml_dtypes
import numpy as np

from jaxllm import progress
from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError
from jaxllm.model import weights
from jaxllm.model.host_arrays import aligned_as
from jaxllm.model.params import (LayerParams, LlamaParams, checkpoint_layer_shapes, fuse_layer_tensors,
                                 global_param_shapes)
from jaxllm.model.tiled_params import tile_head, tile_linears

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def numpy_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def assemble_params(
    config: ModelConfig,
    tensors: Iterable[tuple[str, int | None, str, np.ndarray]],  # (field, layer, name in file, array)
    source: str,
    dtype: str = "float32",
    as_tiles: bool = False,  # the LM head's and each layer's dense bfloat16 linears as AMX tiles (tiled_params)
) -> LlamaParams:
    np_dtype = numpy_dtype(dtype)
    layer_shapes = [checkpoint_layer_shapes(config, i) for i in range(config.num_layers)]  # MoE: differ by layer
    global_shapes = global_param_shapes(config)
    parts: list[dict] = [{} for _ in range(config.num_layers)]  # each layer's tensors until it is complete
    fused: list[dict | None] = [None] * config.num_layers  # then its fused fields (the parts' memory is reused)
    formats: dict[str, str] = {}  # field -> its weight format, the same in every layer
    top: dict[str, np.ndarray] = {}
    expected_count = len(global_shapes) + sum(len(shapes) for shapes in layer_shapes)
    tensors = progress.track(tensors, "Loading weights", "tensors", total=expected_count,
                             nbytes=lambda item: _host_bytes(item[3]))
    for field, layer, name, array in tensors:
        if layer is not None and not 0 <= layer < config.num_layers:
            raise ModelLoadError(source, f"tensor {name!r} is for layer {layer}, but the config has "
                                 f"{config.num_layers} layers")
        expected = global_shapes.get(field) if layer is None else layer_shapes[layer].get(field)
        if expected is None:
            raise ModelLoadError(source, f"unexpected tensor {name!r} for this {config.architecture} config"
                                 + _moe_hint(config, layer))
        if tuple(array.shape) != expected:
            raise ModelLoadError(source, f"tensor {name!r} has shape {tuple(array.shape)}, but the config implies "
                                 f"{expected}")
        if (field in top) if layer is None else (field in parts[layer] or fused[layer] is not None):
            raise ModelLoadError(source, f"tensor {name!r} appears twice")
        if not isinstance(array, weights.WeightFormat):
            array = aligned_as(array, np_dtype)  # CPU devices use it in place (host_arrays)
        if layer is None:
            top[field] = array
            continue
        _check_format(formats, field, array, source)
        parts[layer][field] = array
        if len(parts[layer]) == len(layer_shapes[layer]):
            fused[layer], parts[layer] = _fuse(parts[layer], source), {}
            if as_tiles:  # packed as each layer completes: its dense linears are let go at once
                fused[layer].update(tile_linears(fused[layer]))
    missing = [f for f in global_shapes if f not in top]
    missing += [f"layer {i} {f}" for i, done in enumerate(fused) if done is None
                for f in layer_shapes[i] if f not in parts[i]]
    if missing:
        raise ModelLoadError(source, f"missing tensors: {', '.join(missing[:8])}"
                             + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    params = LlamaParams(layers=tuple(LayerParams(**fields) for fields in fused), **top)
    return tile_head(params) if as_tiles else params


def _moe_hint(config: ModelConfig, layer: int | None) -> str:
    """Why a layer tensor is unexpected in a MoE model: the config makes that layer sparse or dense."""
    if layer is None or not config.num_experts:
        return ""
    kind = "routed over experts" if config.is_moe_layer(layer) else "dense (mlp_only_layers / decoder_sparse_step)"
    return f" (layer {layer}'s MLP is {kind}; its experts must number num_experts = {config.num_experts})"


def _host_bytes(weight) -> int:
    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(weight))


def _check_format(formats: dict[str, str], field: str, weight, source: str) -> None:
    """ModelLoadError naming the formats when one field's weights differ in format from layer to layer (the
    sharding rules and the kernels are chosen per field)."""
    kind = formats.setdefault(field, weights.format_name(weight))
    if kind != weights.format_name(weight):
        raise ModelLoadError(source, f"layers store {field} in different formats: "
                             f"{', '.join(sorted({kind, weights.format_name(weight)}))}: {_ALIKE}")


def _fuse(layer_tensors: dict, source: str) -> dict:
    try:
        return fuse_layer_tensors(layer_tensors)
    except TypeError as e:  # parts that cannot be fused (one of q/k/v packed, ...)
        raise ModelLoadError(source, f"{e}: {_ALIKE}") from e


_ALIKE = "every layer's q, k and v (and gate and up, and every expert's projections) must be stored alike"


def tensor_field(name: str, global_names: Mapping[str, str], layer_pattern: re.Pattern,
                 layer_names: Mapping[str, str]) -> tuple[str | None, int | None]:
    """(params field, layer index or None) of a checkpoint tensor name; (None, None) when it is unknown.
    `layer_pattern` captures (layer index, name within the layer)."""
    if name in global_names:
        return global_names[name], None
    m = layer_pattern.fullmatch(name)
    if m and m.group(2) in layer_names:
        return layer_names[m.group(2)], int(m.group(1))
    return None, None
