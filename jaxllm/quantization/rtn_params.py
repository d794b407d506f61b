"""Round-to-nearest int4 of params already in memory: every linear weight becomes an AWQWeight, no checkpoint
written. For benchmarks and device checks that need an int4 model of some shape quickly; the weights are RTN's
(`jaxllm quantize --method awq` writes better ones, through a checkpoint).
"""

from __future__ import annotations

import jax
import numpy as np

from jaxllm.model.awq_weight import AWQWeight
from jaxllm.loaders.awq import scale_dtype
from jaxllm.model.params import LINEAR_FIELDS, LlamaParams, params_dtype
from jaxllm.quantization.group_quant import quantize_groups
from pallas_kernels.awq_matmul.layout import pack_rows


def rtn_awq_params(params: LlamaParams, group_size: int) -> LlamaParams:
    """params with each linear weight [N, K] replaced by its RTN int4 AWQWeight (host numpy leaves; the other
    params as they were); scales in the params' dtype when 16-bit (the kernel's fast path), else float16 as AutoAWQ
    writes them."""
    quantize = jax.jit(quantize_groups, static_argnums=1)
    scales_as = scale_dtype(params_dtype(params)) or np.float16

    def rtn(w: jax.Array) -> AWQWeight:
        """w [N, K] -> AWQWeight with leaves [K/8, N], [K/G, N]."""
        q, zeros, scales = jax.device_get(quantize(w, group_size))  # [N, K], [N, K/G], [N, K/G]
        return AWQWeight(qweight=pack_rows(q.T), zeros=zeros.T.astype(np.int8), scales=scales.T.astype(scales_as))

    return params.map_layers(lambda layer: layer.replace(**{f: rtn(getattr(layer, f)) for f in LINEAR_FIELDS}))
