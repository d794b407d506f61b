"""Weights stored as AMX tiles where the tiled kernel runs their dots: the LM head and the layers' dense linears.

On a CPU with AMX-BF16 (Kernels.amx_matmul == "cpu") XLA's dot reads a bfloat16 weight at a fraction of the rate
memory allows: the default model's 56.6 MB LM head took 4.3 ms at 64 rows, the AMX kernel over tiles 3.0 ms, and the
layers' q|k|v, o, gate|up and down projections as tiles made the engine's batch-64 workloads 1.02-1.17x faster, a
batch-1 decode ~3-5% slower (benchmarks/RESULTS.md). On a CPU with AVX512-BF16 and no AMX the kernel sums the same
tiles with VDPBF16PS: a batch-64 decode step of the default model took 69 ms against XLA's 89. The runner therefore
stores, once, when it takes the params, every bfloat16 weight of those that lies whole on one device as a
weights.TiledWeight: the LM head itself when untied, the embedding table when tied (it then also serves the
embedding lookup, weights.embedding_rows, so the table is held once), and each layer's dense linear weights (w_qkv,
wo, w_gate_up, w_down). A TiledWeight's dot with a row or two runs the skinny kernel on the tiles
(weights.TiledWeight.dot). Everything else keeps its format (AWQ's packed int4, the experts' stacks, sides that are
not multiples of 32); on other machines and meshes the params are returned unchanged.

An engine that loads its own weights has them packed as they are read instead (loaders.load_host_model's
`as_tiles`, asked where `tiles_wanted`): each layer's linears on the host with numpy, in memory a CPU device uses
in place, as the loader finishes the layer, so the dense weights and their tiles are never all held at once and no
XLA program is built to lay them out. tile_params then finds nothing left to pack.
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np

from jaxllm.model import weights
from jaxllm.model.host_arrays import aligned_empty
from jaxllm.model.kernels import Kernels
from jaxllm.model.params import LINEAR_FIELDS, LayerParams, LlamaParams
from pallas_kernels.amx_matmul.reference import TILE, pack_tiles, tiles_shape


def tile_params(params: LlamaParams, kernels: Kernels, num_devices: int) -> LlamaParams:
    """params with the LM head and the layers' dense linears stored as AMX tiles where the tiled kernel will run
    their dots, else params."""
    if not tiles_wanted(kernels, num_devices):
        return params
    return tile_head(params).map_layers(_tile_layer)


def tiles_wanted(kernels: Kernels, num_devices: int) -> bool:
    """Whether the tiled kernel runs the dots of a model placed on `num_devices` devices."""
    return kernels.amx_matmul == "cpu" and num_devices == 1


def tile_head(params: LlamaParams) -> LlamaParams:
    """params with the LM head (the embedding table when tied) stored as tiles where it takes them."""
    head_field = "embed" if params.lm_head is None else "lm_head"
    head = getattr(params, head_field)  # [V, H]
    return params.replace(**{head_field: _tiled(head)}) if takes_tiles(head) else params


def tile_linears(fields: Mapping[str, object]) -> dict:
    """The tiled weights of a layer's fields (name -> weight): those of its dense linears that take tiles."""
    return {field: _tiled(fields[field]) for field in LINEAR_FIELDS if takes_tiles(fields.get(field))}


def _tile_layer(layer: LayerParams) -> LayerParams:
    return layer.replace(**tile_linears({field: getattr(layer, field) for field in LINEAR_FIELDS}))


def _tiled(w) -> weights.TiledWeight:
    return weights.TiledWeight(tiles=_pack_on_host(w) if isinstance(w, np.ndarray) else pack_tiles(w))


def _pack_on_host(w: np.ndarray) -> np.ndarray:
    """pack_tiles of a host array into memory a CPU device uses in place (model/host_arrays)."""
    return pack_tiles(w, out=aligned_empty(tiles_shape(*w.shape), w.dtype))  # [N/32, K/32, 2, 16, 32]


def takes_tiles(w) -> bool:
    """A dense bfloat16 [N, K] array whose sides are multiples of the tile (32)."""
    return (w is not None and weights.format_name(w) == "dense" and w.ndim == 2 and w.dtype == jnp.bfloat16
            and w.shape[0] % TILE == 0 and w.shape[1] % TILE == 0)
