"""The weight seam (jaxllm/model/weights.py): a weight format defined here, outside the library, runs the Llama forward
and the tensor-parallel layout and placement with no change to layer code. Two test-only formats stand in for the
real ones to come: a per-row scaled weight (the shape of int8/int4 formats' scales) and a weight with a low-rank
delta (LoRA's). Sharded forwards at N = 2 and 4 run on the test process's fake CPU devices (tests/conftest.py)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params, weights
from jaxllm.model import tensor_parallel as tp
from jaxllm.model.kernels import REFERENCE
from jaxllm.model.params import LINEAR_FIELDS

LOGITS_TOLERANCE = 1e-5  # float32


class RowScaled(weights.WeightFormat):
    """W = values * scale[:, None]: one scale per output row."""
    values: jax.Array  # [..., N, K]
    scale: jax.Array  # [..., N]

    def dot(self, x, kernels, live_rows=None):  # computes every row
        return weights.dense_dot(x, self.values) * self.scale.astype(jnp.float32)

    def take_rows(self, index, axis):
        return RowScaled(weights.take_rows(self.values, index, axis), weights.take_rows(self.scale, index, axis))

    def leaf_axes(self, axes):
        return RowScaled(values=tuple(axes), scale=tuple(axes[:-1]))

    def dense(self):
        return self.values * self.scale[..., None]

    @staticmethod
    def of(w):
        """Power-of-two scales: values * scale is exactly w."""
        scale = 2.0 ** jnp.round(jnp.log2(jnp.abs(w).max(axis=-1)))  # [..., N]
        return RowScaled(values=w / scale[..., None], scale=scale)


class LowRankDelta(weights.WeightFormat):
    """W = base + a @ b, base itself any format: a rank-R delta on the output rows (a) and input columns (b)."""
    base: Any  # [..., N, K]
    a: jax.Array  # [..., N, R]
    b: jax.Array  # [..., R, K]

    def dot(self, x, kernels, live_rows=None):
        delta = weights.dense_dot(weights.dense_dot(x, self.b), self.a.astype(jnp.float32))  # [..., N]
        return weights.dot(x, self.base, kernels, live_rows) + delta

    def take_rows(self, index, axis):
        return LowRankDelta(weights.take_rows(self.base, index, axis), weights.take_rows(self.a, index, axis),
                            self.b)

    def leaf_axes(self, axes):
        *lead, rows, cols = axes
        return LowRankDelta(weights.leaf_axes(self.base, axes), a=(*lead, rows, None), b=(*lead, None, cols))

    def dense(self):
        return self.base + self.a @ self.b

    @staticmethod
    def of(w, rank: int = 4):
        key_a, key_b = jax.random.split(jax.random.key(w.shape[-1] * w.shape[-2]))
        a = 0.1 * jax.random.normal(key_a, (*w.shape[:-1], rank))
        b = 0.1 * jax.random.normal(key_b, (*w.shape[:-2], rank, w.shape[-1]))
        return LowRankDelta(base=w - a @ b, a=a, b=b)


FORMATS = {"row_scaled": RowScaled.of, "low_rank_delta": LowRankDelta.of}


def config(num_kv_heads: int = 2, **overrides) -> ModelConfig:
    base = dict(architecture="llama", vocab_size=250, hidden_size=64, intermediate_size=128, num_layers=2,
                num_heads=8, num_kv_heads=num_kv_heads, head_dim=16)
    return ModelConfig(**{**base, **overrides})


def convert(params, to_format):
    """params with every linear weight in the format `to_format` builds from the dense one."""
    return params.map_layers(lambda layer: layer.replace(**{f: to_format(getattr(layer, f)) for f in LINEAR_FIELDS}))


def dense_params(cfg):
    return random_params(cfg, jax.random.key(0), scale=0.1)


@functools.cache
def dense_logits(cfg) -> np.ndarray:
    """The reference: the dense model's logits on one device."""
    return logits(cfg, dense_params(cfg))


def batch():
    chunks = [SequenceChunk(list(range(3, 14)), 0, [1, 2, 3], "all"), SequenceChunk([7, 8, 9], 0, [4])]
    return jax.tree.map(jnp.asarray, build_step_batch(chunks, 4, num_tokens=16, num_seqs=4, max_blocks=4,
                                                      num_logits=16))


def logits(cfg, params) -> np.ndarray:
    out, _ = jit_forward(cfg, REFERENCE)(params, init_kv_cache(cfg, 6, 4), batch())
    return np.asarray(out)


def test_dense_dot_is_x_times_w_transposed_in_float32():
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)  # [..., K]
    w = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)  # [N, K]
    np.testing.assert_allclose(np.asarray(weights.dot(jnp.asarray(x), jnp.asarray(w))), x @ w.T, rtol=1e-5)
    assert weights.dot(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)).dtype == jnp.float32


def test_dense_take_rows_keeps_host_on_host_and_device_on_device():
    w = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)  # [N, K]
    index = np.array([4, 0, 0, 2])  # reordered, one row repeated
    taken = weights.take_rows(w, index, axis=0)
    assert isinstance(taken, np.ndarray)
    np.testing.assert_array_equal(taken, w[index])
    on_device = weights.take_rows(jnp.asarray(w), index, axis=0)
    assert isinstance(on_device, jax.Array)
    np.testing.assert_array_equal(np.asarray(on_device), w[index])
    assert weights.leaf_axes(w, ("heads", "embed")) == ("heads", "embed")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_format_runs_the_forward_unchanged(name):
    cfg = config(qkv_bias=True, architecture="qwen2")
    formatted = convert(dense_params(cfg), FORMATS[name])
    assert all(isinstance(layer.w_qkv, weights.WeightFormat) for layer in formatted.layers)
    np.testing.assert_allclose(logits(cfg, formatted), dense_logits(cfg), rtol=0, atol=LOGITS_TOLERANCE)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("tp_size", [2, 4])
def test_shard_major_layout_lays_out_a_format_like_its_dense_weight(name, tp_size):
    cfg = config()
    params = jax.device_get(dense_params(cfg))  # laid out on the host, as the loaders do
    formatted = convert(params, FORMATS[name])
    laid_out = tp.shard_major_params(formatted, cfg, tp_size).layers
    dense = tp.shard_major_params(params, cfg, tp_size).layers
    for formatted_layer, dense_layer in zip(laid_out, dense, strict=True):
        for field in LINEAR_FIELDS:
            np.testing.assert_allclose(np.asarray(getattr(formatted_layer, field).dense()),
                                       getattr(dense_layer, field), atol=1e-6)


def test_param_shardings_give_each_leaf_of_a_format_its_spec():
    cfg = config()
    params = convert(random_params(cfg, jax.random.key(0)), LowRankDelta.of)
    params = params.map_layers(lambda layer: layer.replace(w_down=RowScaled.of(layer.w_down.base)))
    specs = jax.tree.map(lambda s: s.spec, tp.param_shardings(params, tp.make_mesh(1)))
    assert len(specs.layers) == cfg.num_layers
    for layer in specs.layers:
        assert layer.w_qkv == LowRankDelta(base=P("tp", None), a=P("tp", None), b=P(None, None))
        assert layer.wo == LowRankDelta(base=P(None, "tp"), a=P(None, None), b=P(None, "tp"))
        assert layer.w_down == RowScaled(values=P(None, "tp"), scale=P(None))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_format_runs_the_sharded_forward_on_one_device(name):
    cfg = config(qkv_bias=True, architecture="qwen2")
    mesh = tp.make_mesh(1)
    sharded = tp.shard_params(convert(dense_params(cfg), FORMATS[name]), cfg, mesh)
    got, _ = tp.jit_forward(cfg, REFERENCE, mesh=mesh)(sharded, tp.init_kv_cache(cfg, 6, 4, mesh=mesh), batch())
    np.testing.assert_allclose(np.asarray(got), dense_logits(cfg), rtol=0, atol=LOGITS_TOLERANCE)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("tp_size", [2, 4])
def test_a_format_runs_the_sharded_forward_on_several_devices(name, tp_size):
    cfg = config(qkv_bias=True, architecture="qwen2")  # 2 KV heads: split at N = 2, replicated at N = 4
    mesh = tp.make_mesh(tp_size)
    assert mesh.devices.size == tp_size
    sharded = tp.shard_params(convert(dense_params(cfg), FORMATS[name]), cfg, mesh)
    got, _ = tp.jit_forward(cfg, REFERENCE, mesh=mesh)(sharded, tp.init_kv_cache(cfg, 6, 4, mesh=mesh), batch())
    assert float(np.abs(np.asarray(got) - dense_logits(cfg)).max()) < LOGITS_TOLERANCE
