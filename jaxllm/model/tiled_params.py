"""Weights stored as AMX tiles where the AMX kernel runs their dots: the LM head and the layers' dense linears.

On a CPU with AMX-BF16 (Kernels.amx_matmul == "cpu") XLA's dot reads a bfloat16 weight at a fraction of the rate
memory allows: the default model's 56.6 MB LM head took 4.3 ms at 64 rows, the AMX kernel over tiles 3.0 ms, and
the layers' q|k|v, o, gate|up and down projections as tiles made the engine's batch-64 workloads 1.02-1.17x
faster, a batch-1 decode ~3-5% slower (benchmarks/RESULTS.md). The runner therefore stores, once, when it takes
the params, every bfloat16 weight of those that lies whole on one device as a weights.TiledWeight: the LM head
itself when untied, the embedding table when tied (it then also serves the embedding lookup,
weights.embedding_rows, so the table is held once), and each layer's dense linear weights (w_qkv, wo, w_gate_up,
w_down). A TiledWeight's dot with a row or two runs the skinny kernel on the tiles (weights.TiledWeight.dot).
Everything else keeps its format (AWQ's packed int4, the experts' stacks, sides that are not multiples of 32); on
other machines and meshes the params are returned unchanged. Until the loaded params are let go, the dense
weights and their tiles are both held (the default model's peak memory at start: +211 MB).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxllm.model import weights
from jaxllm.model.kernels import Kernels
from jaxllm.model.params import LINEAR_FIELDS, LayerParams, LlamaParams
from pallas_kernels.amx_matmul.reference import TILE, pack_tiles


def tile_params(params: LlamaParams, kernels: Kernels, num_devices: int) -> LlamaParams:
    """params with the LM head and the layers' dense linears stored as AMX tiles where the AMX kernel will run
    their dots, else params."""
    if not (kernels.amx_matmul == "cpu" and num_devices == 1):
        return params
    head_field = "embed" if params.lm_head is None else "lm_head"
    head = getattr(params, head_field)  # [V, H]
    if takes_tiles(head):
        params = params.replace(**{head_field: _tiled(head)})
    return params.map_layers(_tile_layer)


def _tile_layer(layer: LayerParams) -> LayerParams:
    return layer.replace(**{field: _tiled(getattr(layer, field)) for field in LINEAR_FIELDS
                            if takes_tiles(getattr(layer, field))})


def _tiled(w) -> weights.TiledWeight:
    return weights.TiledWeight(tiles=pack_tiles(w))


def takes_tiles(w) -> bool:
    """A dense bfloat16 [N, K] array whose sides are multiples of the tile (32)."""
    return (w is not None and weights.format_name(w) == "dense" and w.ndim == 2 and w.dtype == jnp.bfloat16
            and w.shape[0] % TILE == 0 and w.shape[1] % TILE == 0)
