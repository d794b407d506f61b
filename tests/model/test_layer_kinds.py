"""The unrolled layer loop traces the layer function once per distinct static kind (window, rope table), not once
per layer: a deeper Gemma 3 costs no more tracing than a shallow one, and a model without windows has one kind."""

from __future__ import annotations

import jax
import pytest

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params, select_kernels
from jaxllm.model import llama

GEMMA3 = dict(architecture="gemma3", vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=2,
              num_kv_heads=1, head_dim=16, sliding_window=4, rope_local_theta=100.0, query_pre_attn_scalar=16.0)


def traces(config: ModelConfig, monkeypatch) -> int:
    count = 0
    original = llama._layer

    def counting(*args, **kwargs):
        nonlocal count
        count += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(llama, "_layer", counting)
    params = random_params(config, jax.random.PRNGKey(0))
    batch = build_step_batch([SequenceChunk(list(range(9)), 0, [1, 2, 3])], 4, num_tokens=16)
    forward = jit_forward(config, select_kernels(attention="reference"))
    forward.lower(params, init_kv_cache(config, 8, 4), batch)
    return count


@pytest.mark.parametrize("num_layers", [6, 18])
def test_gemma3_traces_its_two_kinds_once_each(num_layers, monkeypatch):
    types = tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(num_layers))
    assert traces(ModelConfig(num_layers=num_layers, layer_types=types, **GEMMA3), monkeypatch) == 2


def test_a_model_without_windows_has_one_kind(monkeypatch):
    config = ModelConfig(**{**GEMMA3, "architecture": "qwen3", "sliding_window": None, "rope_local_theta": None,
                            "query_pre_attn_scalar": None}, num_layers=5)
    assert traces(config, monkeypatch) == 1
