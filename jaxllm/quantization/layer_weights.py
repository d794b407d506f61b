"""Loaded params -> one float32 dict per layer, with the fused projections split back apart.

Quantization scales and quantizes each checkpoint linear on its own (q, k, v, gate and up are separate tensors in
an AWQ checkpoint), so the fused LlamaParams layers (model/params.py) are undone here: layer i becomes
{attn_norm, wq, wk, wv, wo, [bq, bk, bv], mlp_norm, w_gate, w_up, w_down}, the names of
params.checkpoint_layer_shapes, in the HF [out, in] layout.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxllm.config import ModelConfig
from jaxllm.model.params import FUSED_FIELDS, LlamaParams, checkpoint_layer_shapes


def split_layers(params: LlamaParams, config: ModelConfig) -> list[dict[str, np.ndarray]]:
    """Host float32 weights of every layer, q/k/v and gate/up apart."""
    return [_split_layer(layer, config) for layer in params.layers]


def _split_layer(layer, config: ModelConfig) -> dict[str, np.ndarray]:
    shapes = checkpoint_layer_shapes(config)
    out = {}
    for field in (f.name for f in dataclasses.fields(layer)):
        value = getattr(layer, field)
        if value is None:
            continue
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise ValueError(f"layer weight {field!r} is already in a packed format ({type(value).__name__}); "
                             f"quantize a model with dense weights")
        out[field] = np.asarray(value, dtype=np.float32)
    for fused, parts in FUSED_FIELDS.items():
        if fused in out:
            cuts = np.cumsum([shapes[p][0] for p in parts])[:-1]
            out.update(zip(parts, np.split(out.pop(fused), cuts, axis=0)))
    return out


def global_weights(params: LlamaParams) -> dict[str, np.ndarray]:
    """embed [V, H], final_norm [H] and, when untied, lm_head [V, H], as host float32."""
    out = {"embed": params.embed, "final_norm": params.final_norm}
    if params.lm_head is not None:
        out["lm_head"] = params.lm_head
    return {name: np.asarray(value, dtype=np.float32) for name, value in out.items()}
