"""The parameter pytree every loader produces: layer weights stacked on a leading [L] axis for lax.scan.

Linear weights keep the Hugging Face [out, in] layout and are applied as x @ w.T (fast on CPU, see layers.linear).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from flax import struct

from jaxllm.config import ModelConfig


@struct.dataclass
class LayerParams:  # every leaf has a leading [L] axis
    attn_norm: jax.Array  # [L, H]
    wq: jax.Array  # [L, Hq*D, H]
    wk: jax.Array  # [L, Hkv*D, H]
    wv: jax.Array  # [L, Hkv*D, H]
    wo: jax.Array  # [L, H, Hq*D]
    mlp_norm: jax.Array  # [L, H]
    w_gate: jax.Array  # [L, F, H]
    w_up: jax.Array  # [L, F, H]
    w_down: jax.Array  # [L, H, F]
    bq: Optional[jax.Array] = None  # [L, Hq*D]  (Qwen2)
    bk: Optional[jax.Array] = None  # [L, Hkv*D]
    bv: Optional[jax.Array] = None  # [L, Hkv*D]


@struct.dataclass
class LlamaParams:
    embed: jax.Array  # [V, H]
    layers: LayerParams
    final_norm: jax.Array  # [H]
    lm_head: Optional[jax.Array] = None  # [V, H]; None when tied to `embed`


def layer_param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of one layer's slice of each LayerParams field (without the [L] axis)."""
    h, f = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {
        "attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h), "wo": (h, q),
        "mlp_norm": (h,), "w_gate": (f, h), "w_up": (f, h), "w_down": (h, f),
    }
    if config.qkv_bias:
        shapes.update(bq=(q,), bk=(kv,), bv=(kv,))
    return shapes


def global_param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of the non-layer fields of LlamaParams."""
    shapes = {"embed": (config.vocab_size, config.hidden_size), "final_norm": (config.hidden_size,)}
    if not config.tie_word_embeddings:
        shapes["lm_head"] = (config.vocab_size, config.hidden_size)
    return shapes


def abstract_params(config: ModelConfig, dtype) -> LlamaParams:
    """A LlamaParams of jax.ShapeDtypeStruct leaves: the target structure for restoring checkpoints."""
    layer = {k: jax.ShapeDtypeStruct((config.num_layers, *s), dtype) for k, s in layer_param_shapes(config).items()}
    top = {k: jax.ShapeDtypeStruct(s, dtype) for k, s in global_param_shapes(config).items()}
    return LlamaParams(layers=LayerParams(**layer), **top)


def random_params(config: ModelConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02) -> LlamaParams:
    """Random weights (norm weights 1) for benchmarks and tests that need no checkpoint."""
    shapes = abstract_params(config, dtype)
    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    values = [scale * jax.random.normal(k, s.shape, jnp.float32) for k, s in zip(keys, leaves)]
    params = jax.tree_util.tree_unflatten(treedef, values)
    params = params.replace(
        final_norm=jnp.ones_like(params.final_norm),
        layers=params.layers.replace(attn_norm=jnp.ones_like(params.layers.attn_norm),
                                     mlp_norm=jnp.ones_like(params.layers.mlp_norm)),
    )
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


def params_dtype(params: LlamaParams):
    """The dtype every weight is stored in."""
    return jax.tree_util.tree_leaves(params)[0].dtype


def param_bytes(params: LlamaParams) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
