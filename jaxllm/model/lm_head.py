"""The LM head's storage: AMX tiles where its dot runs the AMX kernel.

On a CPU with AMX-BF16 (Kernels.amx_matmul == "cpu") XLA's dot of the sampled rows against the [V, H] head reads
the weight at a fraction of the rate memory allows (a batch-64 step: 4.3 ms for the default model's 56.6 MB head,
the AMX kernel over tiles 3.0 ms: benchmarks/RESULTS.md). The runner therefore stores a bfloat16 head that lies
whole on one device as a weights.TiledWeight, once, when it takes the params: the head itself when untied, the
embedding table when tied (it then also serves the embedding lookup, weights.embedding_rows, so the table is held
once). Everything else keeps its format; on other machines and meshes the params are returned unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxllm.model import weights
from jaxllm.model.kernels import Kernels
from jaxllm.model.params import LlamaParams
from pallas_kernels.amx_matmul.reference import TILE, pack_tiles


def tile_lm_head(params: LlamaParams, kernels: Kernels, num_devices: int) -> LlamaParams:
    """params with the LM head stored as AMX tiles where the AMX kernel will run its dot, else params."""
    field = "embed" if params.lm_head is None else "lm_head"
    head = getattr(params, field)  # [V, H]
    if not (kernels.amx_matmul == "cpu" and num_devices == 1 and takes_tiles(head)):
        return params
    return params.replace(**{field: weights.TiledWeight(tiles=pack_tiles(head))})


def takes_tiles(head) -> bool:
    """A dense bfloat16 [V, H] array whose sides are multiples of the tile (32)."""
    return (weights.format_name(head) == "dense" and head.ndim == 2 and head.dtype == jnp.bfloat16
            and head.shape[0] % TILE == 0 and head.shape[1] % TILE == 0)
