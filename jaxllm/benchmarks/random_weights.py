"""Random weights generated on the device, one layer at a time: bf16 (or any float) models and int4 AWQ models of
any shape, for benchmarks on machines without the checkpoint.

Why per layer: one small program, compiled once (a second or two even at Llama-3-8B shapes) and run once per layer,
instead of one program holding every leaf of the model (random_params under jit: hundreds of RNG ops in one
compile). Why on the device: an int4 model made on the host (RTN of dense weights, then packing) moves and packs
every weight in numpy, minutes at 8B; here the packed words are drawn directly (any 32 random bits are eight valid
4-bit codes), so an 8B int4 model takes about as long as its bytes take to write.

A MoE config's sparse layers get its router [E, H], expert stacks [E, 2I, H] and [E, H, I] and (Qwen2-MoE) shared
expert and gate, its dense layers the dense MLP: one program per layer kind. With AWQ the expert stacks are int4
too (each expert drawn in the kernel layout, leaves [E, K/8 | K/G, N]), as is the shared expert; the routers and
the shared expert's gate stay dense, as in AutoAWQ's MoE checkpoints.

Values: linear weights N(0, 0.02) (dense; the routers and experts too) or uniform codes, zero points and scales
whose dequantized weights have roughly the dense ones' scale (AWQ); norm weights 1. They make no sensible text (nor
a sensible routing: near-uniform router logits); timings do not depend on them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxllm.config import ModelConfig
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.params import LINEAR_FIELDS, LayerParams, LlamaParams, global_param_shapes, layer_param_shapes

AWQ_FIELDS = LINEAR_FIELDS + ("w_shared_gate_up", "w_shared_down")  # one [N, K] int4 weight each
AWQ_EXPERT_FIELDS = ("w_experts_gate_up", "w_experts_down")  # [E, N, K]: E int4 weights stacked
from pallas_kernels.awq_matmul.testing import device_random_packed

SCALE = 0.02  # standard deviation of the dense weights, as random_params


def device_random_params(config: ModelConfig, seed: int = 0, dtype=jnp.bfloat16) -> LlamaParams:
    """A LlamaParams of random `dtype` weights on the default device (each layer's arrays of their own)."""
    layers = tuple(_dense_layer(config, dtype, config.is_moe_layer(layer), seed, layer)
                   for layer in range(config.num_layers))
    return LlamaParams(layers=layers, **_globals(config, dtype, seed))


def device_random_awq_params(config: ModelConfig, seed: int = 0, dtype=jnp.bfloat16, group_size: int = 128,
                             scale_dtype=None, base: LlamaParams | None = None) -> LlamaParams:
    """A LlamaParams whose linear weights (q|k|v, o, gate|up, down; a MoE layer's expert stacks and shared expert)
    are random int4 AWQWeights of group_size,
    scales in scale_dtype (default: dtype, the kernel's fast 16-bit dequantization; float16 with bf16 activations
    takes its float32 path); the rest in dtype. base: take embed, final_norm and lm_head from these params (the
    same device arrays, no copy) instead of drawing new ones."""
    scale_dtype = jnp.dtype(dtype if scale_dtype is None else scale_dtype)
    layers = tuple(_awq_layer(config, jnp.dtype(dtype), group_size, scale_dtype, config.is_moe_layer(layer), seed,
                              layer) for layer in range(config.num_layers))
    top = _globals(config, dtype, seed) if base is None else \
        dict(embed=base.embed, final_norm=base.final_norm, lm_head=base.lm_head)
    return LlamaParams(layers=layers, **top)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _globals(config: ModelConfig, dtype, seed) -> dict:
    """embed [V, H], final_norm [H] (ones) and, when untied, lm_head [V, H]."""
    key = jax.random.fold_in(jax.random.key(seed), config.num_layers)  # layers use 0 .. L - 1
    out = {}
    for i, (name, shape) in enumerate(sorted(global_param_shapes(config).items())):
        out[name] = _ones_or_normal(name, shape, dtype, jax.random.fold_in(key, i))
    return out


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _dense_layer(config: ModelConfig, dtype, sparse: bool, seed, layer) -> LayerParams:
    """One layer's weights, a MoE layer's where `sparse`; seed and layer are traced, so all layers of a kind
    share the program."""
    key = jax.random.fold_in(jax.random.key(seed), layer)
    shapes = layer_param_shapes(config, _first_layer(config, sparse))
    return LayerParams(**{name: _ones_or_normal(name, shape, dtype, jax.random.fold_in(key, i))
                          for i, (name, shape) in enumerate(sorted(shapes.items()))})


def _first_layer(config: ModelConfig, sparse: bool) -> int:
    """The first layer of the kind (sparse or dense): its shapes are every such layer's."""
    return next(i for i in range(config.num_layers) if config.is_moe_layer(i) == sparse)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _awq_layer(config: ModelConfig, dtype, group_size: int, scale_dtype, sparse: bool, seed, layer) -> LayerParams:
    """One layer (a MoE layer's where `sparse`) with AWQWeight linears: leaves qweight [K/8, N] int32, zeros
    [K/G, N] int8, scales [K/G, N]; an expert stack's with a leading [E]."""
    key = jax.random.fold_in(jax.random.key(seed), layer)
    fields = {}
    for i, (name, shape) in enumerate(sorted(layer_param_shapes(config, _first_layer(config, sparse)).items())):
        field_key = jax.random.fold_in(key, i)
        if name in AWQ_FIELDS or name in AWQ_EXPERT_FIELDS:
            *experts, n, k = shape  # the dense weight's [E, out, in] or [out, in]
            if k % group_size:
                raise ValueError(f"{name}: input size {k} is not a multiple of the group size {group_size}")
            seeds = jax.random.randint(field_key, tuple(experts), 0, 2**31 - 1)  # [E] or []
            draw = functools.partial(device_random_packed, k=k, n=n, group_size=group_size, scale_dtype=scale_dtype)
            fields[name] = AWQWeight.from_packed(jax.vmap(draw)(seeds) if experts else draw(seeds))
        else:
            fields[name] = _ones_or_normal(name, shape, dtype, field_key)
    return LayerParams(**fields)


def _ones_or_normal(name: str, shape: tuple[int, ...], dtype, key) -> jax.Array:
    if name.endswith("norm"):
        return jnp.ones(shape, dtype)
    return (SCALE * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
