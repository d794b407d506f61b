"""The compiled CPU forward reads every layer's weights where they lie (model/params.py keeps each layer's arrays
apart): no instruction writes a new array the shape of a weight matrix (the per-layer slice copies a scan over
[L, ...] stacks made, or a float32 conversion of bfloat16 weights), in float32 and bfloat16, at one token and
many, and the donated KV pool is updated in place. The same check on the H200 compile is in tests/gpu_compile/test_model_step.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params, select_kernels
from jaxllm.model.tiled_params import tile_params
from tests.compiled_hlo import materialized
from tests.kernels.test_amx_matmul import needs_tiled_kernel

CONFIG = ModelConfig(architecture="llama", vocab_size=96, hidden_size=64, intermediate_size=160, num_layers=3,
                     num_heads=4, num_kv_heads=2, head_dim=16)


def weight_shapes(params) -> set[tuple[int, ...]]:
    return {tuple(a.shape) for layer in params.layers for a in jax.tree.leaves(layer) if a.ndim == 2}


def mixed_batch():
    return build_step_batch([SequenceChunk(list(range(1, 12)), 0, [1]), SequenceChunk([5], 20, [2, 3])], 16,
                            num_tokens=16, num_seqs=2, max_blocks=2)


def one_token_batch():
    """A batch-1 decode step: every linear layer multiplies one row (XLA:CPU converted a whole 16-bit weight to
    float32 for a one-row dot; the CPU kernels run it as a two-row product, model/weights.py)."""
    return build_step_batch([SequenceChunk([5], 20, [2, 3])], 16, num_tokens=1, num_seqs=1, max_blocks=2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("attention", ["reference", "cpu"])
@pytest.mark.parametrize("make_batch", [mixed_batch, one_token_batch], ids=["mixed", "one-token"])
def test_the_compiled_forward_copies_no_weight(dtype, attention, make_batch):
    params = random_params(CONFIG, jax.random.key(0), dtype)
    assert len(params.layers) == CONFIG.num_layers and len(weight_shapes(params)) == 4  # qkv, o, gate|up, down
    kv = init_kv_cache(CONFIG, 8, 16, dtype)
    batch = make_batch()
    compiled = jit_forward(CONFIG, select_kernels(attention)).lower(params, kv, batch).compile()
    hlo = compiled.as_text()
    assert materialized(hlo, weight_shapes(params)) == []
    kv_bytes = 2 * kv.k.size * kv.k.dtype.itemsize
    assert compiled.memory_analysis().alias_size_in_bytes == kv_bytes  # the donated pool, updated in place
    logits, _ = compiled(params, kv, batch)
    assert np.isfinite(np.asarray(logits, np.float32)).all()


@needs_tiled_kernel
@pytest.mark.parametrize("make_batch", [mixed_batch, one_token_batch], ids=["mixed", "one-token"])
def test_weights_stored_as_tiles_are_read_in_place(make_batch):
    """Where the tiled matmul runs (AMX or AVX512-BF16) the layers' linears lie as tiles (model/tiled_params.py),
    read by the tiled kernel (16 tokens) or the skinny kernel (one): neither the tiles nor a dense weight laid back
    out is written."""
    kernels = select_kernels("cpu")
    dense = random_params(CONFIG, jax.random.key(0), jnp.bfloat16)
    params = tile_params(dense, kernels, num_devices=1)
    tiles = {tuple(a.shape) for layer in params.layers for a in jax.tree.leaves(layer) if a.ndim == 5}
    assert len(tiles) == 4  # qkv, o, gate|up, down
    kv = init_kv_cache(CONFIG, 8, 16, jnp.bfloat16)
    hlo = jit_forward(CONFIG, kernels).lower(params, kv, make_batch()).compile().as_text()
    assert materialized(hlo, tiles | weight_shapes(dense)) == []


def test_a_weight_stack_sliced_per_layer_is_seen_as_a_copy():
    """The check above can fail: a scan over layer-stacked weights (the former layout) materializes each slice."""
    params = random_params(CONFIG, jax.random.key(0))
    stacked = jnp.stack([layer.w_gate_up for layer in params.layers])  # [L, 2F, H]

    def scan_over_stack(x, ws):
        return jax.lax.scan(lambda h, w: (jax.lax.dot_general(h, w, (((1,), (1,)), ((), ())))[:, :64], None),
                            x, ws)[0]

    hlo = jax.jit(scan_over_stack).lower(jnp.ones((4, 64)), stacked).compile().as_text()
    assert materialized(hlo, {tuple(stacked.shape[1:])})
