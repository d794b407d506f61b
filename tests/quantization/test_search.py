"""The pieces of AWQ on small random arrays: group quantization, the Gram-matrix error, the scale and clip
searches, and the folding of scales (which must leave the float layer's function unchanged)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.quantization.awq_layer import _fold, scale_groups
from jaxllm.quantization.dense_forward import layer_output
from jaxllm.quantization.group_quant import clip_groups, fake_quantize, quantize_groups
from jaxllm.quantization.search import output_error, scaled_error, search_clip, search_scales


def _random(shape, seed, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, jnp.float32)


def test_group_quantization_follows_the_rule():
    w = _random((8, 64), 0)
    q, zero, scale = quantize_groups(w, 16)
    g = np.asarray(w).reshape(8, 4, 16)
    expected_scale = ((g.max(-1) - g.min(-1)) / 15).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(scale), expected_scale)
    np.testing.assert_array_equal(np.asarray(zero), np.clip(np.round(-g.min(-1) / expected_scale), 0, 15))
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    error = np.abs(np.asarray(fake_quantize(w, 16)) - np.asarray(w)).reshape(8, 4, 16)
    assert (error <= expected_scale[..., None] * (1 + 1e-5)).all()  # half a step of rounding, half of the zero's


def test_gram_error_equals_the_direct_output_error():
    x, dw = _random((300, 32), 1), _random((16, 32), 2, 0.01)  # [M, K] inputs, [N, K] weight change
    direct = jnp.sum((x @ dw.T) ** 2) / x.shape[0]
    np.testing.assert_allclose(output_error(dw, x.T @ x / x.shape[0]), direct, rtol=1e-4)


def test_scale_search_never_loses_to_round_to_nearest():
    """alpha = 0 is s = 1 (RTN); a few channels with large inputs make a larger alpha pay off."""
    x = _random((512, 64), 3) * jnp.where(jnp.arange(64) % 16 == 0, 20.0, 1.0)  # outlier channels
    w = _random((32, 64), 4, 0.05)
    gram, mean_abs = x.T @ x / 512, jnp.abs(x).mean(0)
    s, alpha, errors = search_scales(w, gram, mean_abs, 16, 10)
    np.testing.assert_allclose(errors[0], scaled_error(w, gram, jnp.ones(64), 16), rtol=1e-6)
    assert float(alpha) > 0 and float(errors.min()) < 0.9 * float(errors[0])
    np.testing.assert_allclose(float(s.max() * s.min()), 1.0, rtol=1e-4)
    direct = lambda s: jnp.sum((x @ w.T - (x / s) @ fake_quantize(w * s, 16).T) ** 2) / 512  # noqa: E731
    assert float(direct(s)) < float(direct(jnp.ones(64)))


def test_clip_search_lowers_each_groups_error():
    w = _random((16, 64), 5, 0.05).at[:, 3].set(0.5)  # one outlier column
    x = _random((400, 64), 6)
    gram = x.T @ x / 400
    max_val = search_clip(w, gram, 16)
    org_max = np.abs(np.asarray(w)).reshape(16, 4, 16).max(-1)
    assert (np.asarray(max_val) <= org_max + 1e-7).all() and (np.asarray(max_val) >= 0.5 * org_max).all()
    clipped = clip_groups(w, max_val, 16)
    assert float(output_error(w - fake_quantize(clipped, 16), gram)) <= float(output_error(w - fake_quantize(w, 16),
                                                                                          gram))


@pytest.mark.parametrize("num_kv_heads,bias", [(4, False), (2, True)])
def test_folding_scales_keeps_the_float_layer_exact(num_kv_heads, bias):
    """Every scale group's fold (norms, v rows and bias when MHA, up rows) leaves the layer's output unchanged."""
    config = ModelConfig(architecture="llama", vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=4, num_kv_heads=num_kv_heads, head_dim=8, qkv_bias=bias)
    q, kv = 32, 8 * num_kv_heads
    shapes = {"attn_norm": (32,), "wq": (q, 32), "wk": (kv, 32), "wv": (kv, 32), "wo": (32, q), "mlp_norm": (32,),
              "w_gate": (64, 32), "w_up": (64, 32), "w_down": (32, 64)}
    if bias:
        shapes.update(bq=(q,), bk=(kv,), bv=(kv,))
    w = {name: _random(shape, i, 0.3) + (1.0 if "norm" in name else 0.0) for i, (name, shape) in
         enumerate(shapes.items())}
    x = _random((2, 10, 32), 99)
    before = layer_output(w, x, config)
    folded = dict(w)
    groups = scale_groups(config)
    assert [g.tap for g in groups] == (["qkv", "o", "gate_up", "down"] if num_kv_heads == 4 else
                                       ["qkv", "gate_up", "down"])
    for i, group in enumerate(groups):
        k = folded[group.linears[0]].shape[1]
        _fold(folded, group, jnp.exp(_random((k,), 50 + i, 0.5)))
    assert not np.allclose(folded["w_up"], w["w_up"])
    np.testing.assert_allclose(layer_output(folded, x, config), before, rtol=2e-4, atol=2e-5)
