"""The Llama forward with each attention kernel equals the forward with reference attention.

The kernels: Pallas (interpret mode on CPU) and the native CPU kernel. Three steps on a tiny random-weight model,
each backend with its own KV cache: two mixed steps (whole prompts, a prefill chunk after a cached prefix, a decode
token) through the ragged kernel, then a decode-only step with a padded sequence (Pallas: the split-KV kernel).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params
from jaxllm.model import kernels, select_kernels
from jaxllm.model.kernels import resolve_attention

CONFIG = ModelConfig(architecture="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16)
BLOCK_SIZE = 16


def _steps(rng: np.random.Generator):
    """Three steps' chunks for sequences a (blocks 3, 7), b (blocks 5, 1, 6) and c (block 2)."""
    def tok(n):
        return rng.integers(0, CONFIG.vocab_size, n).tolist()

    a, b, c = [3, 7], [5, 1, 6], [2]
    return [
        [SequenceChunk(tok(10), 0, a), SequenceChunk(tok(12), 0, b)],
        [SequenceChunk(tok(1), 10, a), SequenceChunk(tok(17), 12, b), SequenceChunk(tok(3), 0, c, "all")],
        [SequenceChunk(tok(1), 11, a), SequenceChunk(tok(1), 29, b), SequenceChunk(tok(1), 3, c)],
    ]


@pytest.mark.slow  # a 20-step model run per kernel (pallas: interpreted)
@pytest.mark.parametrize("kernel", ["pallas", "cpu"])
def test_kernel_attention_model_matches_reference(kernel):
    params = random_params(CONFIG, jax.random.key(0), jnp.float32, scale=0.1)
    steps = _steps(np.random.default_rng(0))
    forwards = {name: jit_forward(CONFIG, select_kernels(name)) for name in ("reference", kernel)}
    caches = {name: init_kv_cache(CONFIG, num_blocks=8, block_size=BLOCK_SIZE) for name in forwards}
    for i, chunks in enumerate(steps):
        batch = build_step_batch(chunks, BLOCK_SIZE, num_tokens=32, num_seqs=4, max_blocks=3)
        logits = {}
        for name, forward in forwards.items():
            logits[name], caches[name] = forward(params, caches[name], batch)
        expected, actual = np.asarray(logits["reference"]), np.asarray(logits[kernel])
        assert not np.isnan(actual).any()
        np.testing.assert_allclose(actual, expected, rtol=2e-4, atol=2e-4, err_msg=f"step {i}")
    np.testing.assert_allclose(np.asarray(caches[kernel].k), np.asarray(caches["reference"].k), atol=1e-4)


ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU backend's choice; on a GPU 'auto' is pallas")


@ON_CPU
def test_auto_is_the_native_kernel_on_cpu():
    assert resolve_attention("auto") == "cpu"


@ON_CPU
def test_auto_falls_back_to_reference_where_the_kernel_cannot_be_built(monkeypatch, caplog):
    monkeypatch.setattr(kernels, "cpu_kernel_error", lambda: "no C++ compiler: 'c++' is not on PATH")
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        assert resolve_attention("auto") == "reference"
    assert "no C++ compiler" in caplog.text
    with pytest.raises(ValueError, match="'cpu' cannot run here: no C\\+\\+ compiler"):
        resolve_attention("cpu")
