"""The LM head stored as AMX tiles (jaxllm/model/lm_head.py): which heads are tiled, the forward with a tiled head
(tied: it also serves the embedding lookup) equal to the dense forward, and an engine whose head runs the AMX
kernel generating what the dense engine generates."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params, weights
from jaxllm.model.kernels import REFERENCE
from jaxllm.model.lm_head import tile_lm_head
from tests.kernels.test_amx_matmul import needs_amx

AMX = dataclasses.replace(REFERENCE, amx_matmul="cpu")


def _config(**overrides) -> ModelConfig:
    fields = dict(architecture="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True)
    return ModelConfig(**{**fields, **overrides})


def _params(config: ModelConfig, dtype=jnp.bfloat16):
    return random_params(config, jax.random.key(0), dtype, scale=0.1)


@pytest.mark.parametrize("tied", [True, False])
def test_the_head_is_tiled_where_the_amx_kernel_runs_its_dot(tied):
    params = _params(_config(tie_word_embeddings=tied))
    field = "embed" if tied else "lm_head"
    tiled = tile_lm_head(params, AMX, num_devices=1)
    assert isinstance(getattr(tiled, field), weights.TiledWeight)
    np.testing.assert_array_equal(np.asarray(weights.embedding_rows(tiled.embed, jnp.arange(96))),
                                  np.asarray(params.embed))
    untouched = [f for f in ("embed", "lm_head") if f != field]
    assert all(getattr(tiled, f) is getattr(params, f) for f in untouched)


@pytest.mark.parametrize("why", ["reference kernels", "two devices", "float32", "hidden size 48", "vocabulary 100"])
def test_other_heads_stay_dense(why):
    config = {"hidden size 48": _config(hidden_size=48, head_dim=12),
              "vocabulary 100": _config(vocab_size=100)}.get(why, _config())
    params = _params(config, jnp.float32 if why == "float32" else jnp.bfloat16)
    kernels = REFERENCE if why == "reference kernels" else AMX
    assert tile_lm_head(params, kernels, num_devices=2 if why == "two devices" else 1) is params


def _forward_logits(config, params, kernels):
    batch = build_step_batch([SequenceChunk([5, 90, 33, 2], 0, [0]), SequenceChunk([64], 7, [1])], 8, num_tokens=8)
    logits, _ = jit_forward(config, kernels)(params, init_kv_cache(config, 4, 8, jnp.bfloat16), batch)
    return np.asarray(logits)


@pytest.mark.parametrize("tied", [True, False])
def test_the_forward_with_a_tiled_head_is_the_dense_forward(tied):
    """On any machine: the tiles' jnp contract (laid back out, the same dot) gives the dense logits bit for bit."""
    config = _config(tie_word_embeddings=tied)
    params = _params(config)
    tiled = tile_lm_head(params, AMX, num_devices=1)
    np.testing.assert_array_equal(_forward_logits(config, tiled, REFERENCE), _forward_logits(config, params,
                                                                                             REFERENCE))


@needs_amx
def test_the_forward_with_the_amx_kernel_matches_the_dense_forward():
    config = _config()
    params = _params(config)
    tiled = tile_lm_head(params, AMX, num_devices=1)
    got, want = _forward_logits(config, tiled, AMX), _forward_logits(config, params, REFERENCE)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert "jaxllm_tiled_matmul" in jit_forward(config, AMX).lower(
        tiled, init_kv_cache(config, 4, 8, jnp.bfloat16),
        build_step_batch([SequenceChunk([1, 2], 0, [0])], 8, num_tokens=8)).as_text()


@needs_amx
def test_an_engine_with_the_tiled_head_generates_what_the_dense_one_does(tiny_model_with_tokenizer, monkeypatch):
    import jaxllm.engine.engine as engine_module
    from jaxllm.llm import LLM
    from jaxllm.sampling_params import SamplingParams

    select = engine_module.select_kernels
    outputs = {}
    for choice in ("reference", "cpu"):
        monkeypatch.setattr(engine_module, "select_kernels",
                            lambda *a, **k: dataclasses.replace(select(*a, **k), amx_matmul=choice))
        llm = LLM(model=str(tiny_model_with_tokenizer), dtype="bfloat16", max_num_seqs=4, max_model_len=64,
                  compilation_cache=False)
        head = llm.engine.runner.params.embed
        assert isinstance(head, weights.TiledWeight) == (choice == "cpu")
        assert llm.engine.loaded.params.embed is head  # one copy of the table
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
        outputs[choice] = llm.generate(["Hello there", "1, 2, 3,", "The sky is"], params, use_tqdm=False)
    for dense, tiled in zip(outputs["reference"], outputs["cpu"]):
        assert dense.outputs[0].token_ids == tiled.outputs[0].token_ids
        for a, b in zip(dense.outputs[0].logprobs, tiled.outputs[0].logprobs):
            assert a.keys() == b.keys()
            assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)
