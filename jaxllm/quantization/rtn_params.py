"""Round-to-nearest int4 of params already in memory: every linear weight becomes an AWQWeight, no checkpoint
written. For benchmarks and device checks that need an int4 model of some shape quickly; the weights are RTN's
(`jaxllm quantize --method awq` writes better ones, through a checkpoint).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxllm.model import weights
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.params import LINEAR_FIELDS, LlamaParams
from jaxllm.quantization.group_quant import quantize_groups
from pallas_kernels.awq_matmul.layout import pack_rows


def rtn_awq_params(params: LlamaParams, group_size: int) -> LlamaParams:
    """params with each linear weight [L, N, K] replaced by its RTN int4 AWQWeight (host numpy leaves; the other
    params as they were)."""
    packed = {field: _rtn(getattr(params.layers, field), group_size) for field in LINEAR_FIELDS}
    return params.replace(layers=params.layers.replace(**packed))


def _rtn(w: jax.Array, group_size: int) -> AWQWeight:
    """w [L, N, K] -> AWQWeight with leaves [L, K/8, N], [L, K/G, N], quantized one layer at a time."""
    quantize = jax.jit(quantize_groups, static_argnums=1)
    layers = []
    for layer in range(w.shape[0]):
        q, zeros, scales = jax.device_get(quantize(w[layer], group_size))  # [N, K], [N, K/G], [N, K/G]
        layers.append(AWQWeight(qweight=pack_rows(q.T), zeros=zeros.T.astype(np.int8),
                                scales=scales.T.astype(np.float16)))
    return weights.stack(layers)
