"""The parameter pytree every loader produces: one LayerParams per layer, each layer's weights arrays of their own.

    LlamaParams.layers = (LayerParams of layer 0, LayerParams of layer 1, ...)     L entries

Each layer's weights are separate arrays, not slices of [L, ...] stacks, so that the forward's layer loop reads
every weight where it lies: a stack sliced per layer (lax.scan over [L, ...] params) becomes a copy of each
layer's weights at every step, on GPU and CPU alike (the compiled programs show a dynamic-slice copy per weight per
layer: a batch-1 8B decode step moved ~2.9x its weight bytes). The KV pool stays one [L, ...] array: the attention
kernels take the whole pool and a layer index.

Linear weights keep the Hugging Face [out, in] layout and are applied as x @ w.T (fast on CPU, see layers.linear).
A linear weight field holds any weight format (weights.py): a dense array, as every loader produces, or a
WeightFormat; the shapes below are those of the dense weight. Projections that read the same input are stored
fused along the output axis, so each is one larger matmul: q|k|v -> w_qkv and gate|up -> w_gate_up. Checkpoints
hold them apart (checkpoint_layer_shapes); the loaders check those and `fuse_layer_tensors` joins them.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxllm.config import ModelConfig
from jaxllm.model import weights
from jaxllm.model.host_arrays import aligned_empty

Weight = Any  # a linear layer's weight: a dense array or a weights.WeightFormat (layers.linear takes either)


@struct.dataclass
class LayerParams:  # one layer's weights
    attn_norm: jax.Array  # [H]
    w_qkv: Weight  # [(Hq + 2*Hkv)*D, H]: rows q, then k, then v
    wo: Weight  # [H, Hq*D]
    mlp_norm: jax.Array  # [H]
    w_gate_up: Weight = None  # [2*F, H]: rows gate, then up  (None in a mixture-of-experts layer)
    w_down: Weight = None  # [H, F]
    b_qkv: Optional[jax.Array] = None  # [(Hq + 2*Hkv)*D]  (Qwen2)
    q_norm: Optional[jax.Array] = None  # [D]  per-head norm of q before rope (Qwen3, Gemma 3)
    k_norm: Optional[jax.Array] = None  # [D]  per-head norm of k before rope
    post_attn_norm: Optional[jax.Array] = None  # [H]  after attention, before the residual add (Gemma 2/3)
    post_mlp_norm: Optional[jax.Array] = None  # [H]  after the MLP, before the residual add (Gemma 2/3)
    # a mixture-of-experts layer (model/moe.py), in place of w_gate_up / w_down
    router: Optional[jax.Array] = None  # [E, H]
    w_experts_gate_up: Weight = None  # [E, 2*I, H]: per expert, rows gate then up (dense, or AWQ int4 stacked)
    w_experts_down: Weight = None  # [E, H, I]
    w_shared_gate_up: Weight = None  # [2*S, H]  Qwen2-MoE's shared expert
    w_shared_down: Weight = None  # [H, S]
    shared_gate: Optional[jax.Array] = None  # [1, H]  its per-token gate, sigmoid(x @ shared_gate.T)


@struct.dataclass
class LlamaParams:
    embed: jax.Array  # [V, H]
    layers: tuple[LayerParams, ...]  # one per layer, in order
    final_norm: jax.Array  # [H]
    lm_head: Optional[jax.Array] = None  # [V, H]; None when tied to `embed`

    def map_layers(self, fn) -> LlamaParams:
        """The same params with every layer replaced by fn(layer)."""
        return self.replace(layers=tuple(fn(layer) for layer in self.layers))


LINEAR_FIELDS = ("w_qkv", "wo", "w_gate_up", "w_down")
NORM_FIELDS = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")  # the LayerParams fields that hold any weight format

# fused LayerParams field -> the checkpoint fields joined along the output axis, in this order
FUSED_FIELDS = {"w_qkv": ("wq", "wk", "wv"), "b_qkv": ("bq", "bk", "bv"), "w_gate_up": ("w_gate", "w_up"),
                "w_shared_gate_up": ("w_shared_gate", "w_shared_up")}
_FUSED_PARTS = {part for parts in FUSED_FIELDS.values() for part in parts}
# a MoE layer's per-expert checkpoint fields "expert.{e}.{part}" -> the stacked [E, ...] field they make
EXPERT_PARTS = {"w_experts_gate_up": ("gate", "up"), "w_experts_down": ("down",)}


def checkpoint_layer_shapes(config: ModelConfig, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """Shape of layer `layer`'s tensors as checkpoints store them (q, k, v, gate and up apart, unless the family's
    checkpoints fuse them: Phi-3; a MoE layer's experts one by one), without [L]; the family's extra norms
    included (architecture.py)."""
    h, f, d, arch = config.hidden_size, config.intermediate_size, config.head_dim, config.arch
    q, kv = config.num_heads * d, config.num_kv_heads * d
    shapes = {
        "attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h), "wo": (h, q),
        "mlp_norm": (h,), "w_gate": (f, h), "w_up": (f, h), "w_down": (h, f),
    }
    if config.is_moe_layer(layer):
        for name in ("w_gate", "w_up", "w_down"):
            del shapes[name]
        shapes.update(_expert_shapes(config))
    if arch.fused_checkpoint:
        for name in ("wq", "wk", "wv", "w_gate", "w_up"):
            del shapes[name]
        shapes.update(w_qkv=(q + 2 * kv, h), w_gate_up=(2 * f, h))
    if config.qkv_bias:
        shapes.update(bq=(q,), bk=(kv,), bv=(kv,))
    if arch.qk_norm:
        shapes.update(q_norm=(d,), k_norm=(d,))
    if arch.sandwich_norms:
        shapes.update(post_attn_norm=(h,), post_mlp_norm=(h,))
    return shapes


def _expert_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """A MoE layer's router, each expert's gate/up/down (checkpoint field "expert.{e}.{part}") and the shared
    expert with its gate where the family has one."""
    h, i, s = config.hidden_size, config.moe_intermediate_size, config.shared_expert_intermediate_size
    shapes = {"router": (config.num_experts, h)}
    for e in range(config.num_experts):
        shapes.update({expert_field(e, "gate"): (i, h), expert_field(e, "up"): (i, h), expert_field(e, "down"): (h, i)})
    if config.arch.shared_expert:
        shapes.update(w_shared_gate=(s, h), w_shared_up=(s, h), w_shared_down=(h, s), shared_gate=(1, h))
    return shapes


def expert_field(expert: int, part: str) -> str:
    """The checkpoint field of one expert's gate, up or down weight (stacked into EXPERT_PARTS' fields)."""
    return f"expert.{expert}.{part}"


def layer_param_shapes(config: ModelConfig, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """Shape of layer `layer`'s slice of each LayerParams field (fused and stacked, without the [L] axis)."""
    parts = checkpoint_layer_shapes(config, layer)
    shapes = {k: v for k, v in parts.items() if k not in _FUSED_PARTS and not k.startswith("expert.")}
    for fused, names in FUSED_FIELDS.items():
        if names[0] in parts and fused not in parts:
            shapes[fused] = (sum(parts[n][0] for n in names), *parts[names[0]][1:])
    if config.is_moe_layer(layer):
        h, i = config.hidden_size, config.moe_intermediate_size
        shapes.update(w_experts_gate_up=(config.num_experts, 2 * i, h), w_experts_down=(config.num_experts, h, i))
    return shapes


def fuse_layer_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One layer's checkpoint-field arrays [out, ...] -> its LayerParams-field arrays (fused on the out axis; a MoE
    layer's experts stacked into [E, ...])."""
    fused = {k: v for k, v in tensors.items() if k not in _FUSED_PARTS and not k.startswith("expert.")}
    for name, parts in FUSED_FIELDS.items():
        if parts[0] in tensors:
            fused[name] = weights.concat_rows([tensors[p] for p in parts], axis=0)
    num_experts = sum(1 for k in tensors if k.endswith(".down") and k.startswith("expert."))
    if num_experts:
        fused.update({name: _stack_experts(tensors, parts, num_experts) for name, parts in EXPERT_PARTS.items()})
    return fused


def _stack_experts(tensors: dict[str, np.ndarray], parts: tuple[str, ...], num_experts: int):
    """Each expert's parts [rows, K] joined on their rows, the experts stacked: [E, sum of rows, K]. Dense parts
    are written once into aligned memory; a packed format's (AWQ int4) joined and stacked leaf by leaf
    (weights.stack); TypeError naming the formats when the experts' parts are not all stored alike."""
    experts = [[tensors[expert_field(e, p)] for p in parts] for e in range(num_experts)]
    if {weights.format_name(w) for expert in experts for w in expert} != {"dense"}:
        return weights.stack([weights.concat_rows(expert, axis=0) for expert in experts])
    first = experts[0]
    out = aligned_empty((num_experts, sum(a.shape[0] for a in first), *first[0].shape[1:]), first[0].dtype)
    for e, expert in enumerate(experts):
        np.concatenate(expert, axis=0, out=out[e])
    return out


def global_param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of the non-layer fields of LlamaParams."""
    shapes = {"embed": (config.vocab_size, config.hidden_size), "final_norm": (config.hidden_size,)}
    if not config.tie_word_embeddings:
        shapes["lm_head"] = (config.vocab_size, config.hidden_size)
    return shapes


def param_count(config: ModelConfig) -> int:
    """The number of parameters the config's shapes make (computed from the shapes: nothing is allocated)."""
    layers = sum(count * sum(math.prod(s) for s in checkpoint_layer_shapes(config, layer).values())
                 for layer, count in _layers_by_kind(config))
    top = sum(math.prod(s) for s in global_param_shapes(config).values())
    return top + layers


def _layers_by_kind(config: ModelConfig) -> list[tuple[int, int]]:
    """(a layer of each MLP kind, how many layers have it): a MoE model's sparse and dense layers, or all layers;
    without a loop over the layers, so that an absurd num_layers is counted at once."""
    if not config.num_experts:
        return [(0, config.num_layers)]
    dense = sorted(set(config.dense_layers))
    first_sparse = next(i for i in range(len(dense) + 1) if i not in dense)  # dense holds len(dense) indices
    sparse = [(first_sparse, config.num_layers - len(dense))]
    return sparse + [(dense[0], len(dense))] if dense else sparse


def abstract_params(config: ModelConfig, dtype) -> LlamaParams:
    """A LlamaParams of jax.ShapeDtypeStruct leaves: the target structure for restoring checkpoints."""
    def layer(i: int) -> LayerParams:
        return LayerParams(**{k: jax.ShapeDtypeStruct(s, dtype) for k, s in layer_param_shapes(config, i).items()})

    top = {k: jax.ShapeDtypeStruct(s, dtype) for k, s in global_param_shapes(config).items()}
    return LlamaParams(layers=tuple(layer(i) for i in range(config.num_layers)), **top)


def random_params(config: ModelConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02) -> LlamaParams:
    """Random weights (norm weights 1) for benchmarks and tests that need no checkpoint."""
    shapes = abstract_params(config, dtype)
    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    values = [scale * jax.random.normal(k, s.shape, jnp.float32) for k, s in zip(keys, leaves)]
    params = jax.tree_util.tree_unflatten(treedef, values)
    params = params.replace(final_norm=jnp.ones_like(params.final_norm)).map_layers(
        lambda layer: layer.replace(**{f: jnp.ones_like(getattr(layer, f)) for f in NORM_FIELDS
                                       if getattr(layer, f) is not None}))
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


def params_dtype(params: LlamaParams):
    """The dtype activations run in: the embedding table's (dense in every format; a packed weight's leaves may
    be integers)."""
    return params.embed.dtype


def param_bytes(params: LlamaParams) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))


def param_bytes_per_device(params: LlamaParams) -> int:
    """Bytes of the params on one device: the whole of a replicated or single-device array, one shard of a split
    one (tensor_parallel.py splits them evenly)."""
    def on_one_device(leaf) -> int:
        shards = getattr(leaf, "addressable_shards", None)
        return shards[0].data.nbytes if shards else leaf.size * leaf.dtype.itemsize

    return sum(on_one_device(leaf) for leaf in jax.tree_util.tree_leaves(params))
