"""The LM head and the layers' linears stored as AMX tiles (jaxllm/model/tiled_params.py): which weights are tiled,
the same tiles packed by the loader on the host, the forward with tiled weights (a tied head also serves the
embedding lookup) equal to the dense forward, and an engine whose weights' dots run the AMX and skinny kernels
generating what the dense engine generates."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.loaders import load_host_model
from jaxllm.model import (SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params, tiled_params,
                          weights)
from jaxllm.model.host_arrays import is_aligned
from jaxllm.model.kernels import REFERENCE
from jaxllm.model.params import LINEAR_FIELDS
from jaxllm.model.tiled_params import tile_params
from pallas_kernels.amx_matmul.reference import pack_tiles, unpack_tiles
from tests.kernels.test_amx_matmul import needs_tiled_kernel

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
    tiled = tile_params(params, AMX, num_devices=1)
    assert isinstance(getattr(tiled, field), weights.TiledWeight)
    np.testing.assert_array_equal(np.asarray(weights.embedding_rows(tiled.embed, jnp.arange(96))),
                                  np.asarray(params.embed))
    untouched = [f for f in ("embed", "lm_head") if f != field]
    assert all(getattr(tiled, f) is getattr(params, f) for f in untouched)


def test_the_layers_linears_are_tiled_and_the_rest_kept():
    params = _params(_config())
    tiled = tile_params(params, AMX, num_devices=1)
    for layer, dense in zip(tiled.layers, params.layers):
        for field in LINEAR_FIELDS:
            w = getattr(layer, field)
            assert isinstance(w, weights.TiledWeight) and w.shape == getattr(dense, field).shape
            np.testing.assert_array_equal(np.asarray(unpack_tiles(w.tiles)), np.asarray(getattr(dense, field)))
        assert layer.attn_norm is dense.attn_norm and layer.mlp_norm is dense.mlp_norm


def test_a_linear_whose_sides_are_not_tiles_stays_dense():
    """Intermediate size 72: gate|up [144, 64] and down [64, 72] keep their dense arrays, q|k|v and o are tiled."""
    params = _params(_config(intermediate_size=72))
    layer, dense = tile_params(params, AMX, num_devices=1).layers[0], params.layers[0]
    assert layer.w_gate_up is dense.w_gate_up and layer.w_down is dense.w_down
    assert isinstance(layer.w_qkv, weights.TiledWeight) and isinstance(layer.wo, weights.TiledWeight)


@pytest.mark.parametrize("why", ["reference kernels", "two devices", "float32"])
def test_nothing_is_tiled_elsewhere(why):
    params = _params(_config(), jnp.float32 if why == "float32" else jnp.bfloat16)
    kernels = REFERENCE if why == "reference kernels" else AMX
    tiled = tile_params(params, kernels, num_devices=2 if why == "two devices" else 1)
    assert jax.tree.structure(tiled) == jax.tree.structure(params)
    assert all(a is b for a, b in zip(jax.tree.leaves(tiled), jax.tree.leaves(params)))


@pytest.mark.parametrize("why", ["hidden size 48", "vocabulary 100"])
def test_a_head_whose_sides_are_not_tiles_stays_dense(why):
    config = {"hidden size 48": _config(hidden_size=48, head_dim=12), "vocabulary 100": _config(vocab_size=100)}[why]
    params = _params(config)
    assert tile_params(params, AMX, num_devices=1).embed is params.embed


def _save_model(directory, **overrides):
    """A tiny random Llama checkpoint (config.json and model.safetensors) of vocabulary 96."""
    import json

    from safetensors.numpy import save_file

    from tests.tiny_models import TOKENIZER_MODEL_CONFIG, _tiny_llama_weights

    config = {**TOKENIZER_MODEL_CONFIG, "vocab_size": 96, **overrides}
    tensors = _tiny_llama_weights(config)
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"][::-1].copy()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("tied", [True, False])
def test_the_loader_packs_on_the_host_the_tiles_tile_params_would(tmp_path, tied):
    """load_host_model(as_tiles=True): the same tiles as tile_params over the dense load, numpy arrays in memory a
    CPU device uses in place (placed without a copy); tile_params then finds nothing left to pack."""
    path = _save_model(tmp_path, tie_word_embeddings=tied)
    dense = load_host_model(path, dtype="bfloat16").params
    loaded = load_host_model(path, dtype="bfloat16", as_tiles=True).params
    want = tile_params(jax.device_put(dense), AMX, num_devices=1)
    assert jax.tree.structure(loaded) == jax.tree.structure(want)
    tiled = [w for w in jax.tree.leaves(loaded, is_leaf=lambda x: isinstance(x, weights.TiledWeight))
             if isinstance(w, weights.TiledWeight)]
    assert len(tiled) == len(LINEAR_FIELDS) * len(loaded.layers) + 1  # and the head
    for got, expected in zip(jax.tree.leaves(loaded), jax.tree.leaves(want)):
        assert isinstance(got, np.ndarray) and is_aligned(got)
        np.testing.assert_array_equal(got, np.asarray(expected))
    placed = jax.device_put(tiled[0].tiles, jax.devices("cpu")[0])
    assert placed.unsafe_buffer_pointer() == tiled[0].tiles.ctypes.data  # shared, not copied
    again = tile_params(loaded, AMX, num_devices=1)
    assert all(a is b for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(loaded)))


def test_the_loader_packs_only_what_takes_tiles(tmp_path):
    """float32 weights stay dense; so does a bfloat16 linear whose sides are not multiples of 32 (down [64, 72])."""
    path = _save_model(tmp_path, intermediate_size=72)
    layer = load_host_model(path, dtype="bfloat16", as_tiles=True).params.layers[0]
    assert isinstance(layer.wo, weights.TiledWeight) and isinstance(layer.w_down, np.ndarray)
    as_float32 = load_host_model(path, dtype="float32", as_tiles=True).params
    assert not any(isinstance(w, weights.TiledWeight) for w in
                   jax.tree.leaves(as_float32, is_leaf=lambda x: isinstance(x, weights.TiledWeight)))


def test_host_packing_equals_the_jnp_packing():
    w = np.asarray(jax.random.normal(jax.random.key(1), (64, 96), jnp.bfloat16))
    host = tiled_params._tiled(w).tiles
    assert isinstance(host, np.ndarray) and is_aligned(host)
    np.testing.assert_array_equal(host, np.asarray(pack_tiles(jnp.asarray(w))))
    np.testing.assert_array_equal(unpack_tiles(host), w)


def _forward_logits(config, params, kernels, chunks=None, num_tokens=8):
    chunks = chunks or [SequenceChunk([5, 90, 33, 2], 0, [1]), SequenceChunk([64], 7, [2])]
    batch = build_step_batch(chunks, 8, num_tokens=num_tokens)
    logits, _ = jit_forward(config, kernels)(params, init_kv_cache(config, 4, 8, jnp.bfloat16), batch)
    return np.asarray(logits)


@pytest.mark.parametrize("tied", [True, False])
def test_the_forward_with_tiled_weights_is_the_dense_forward(tied):
    """On any machine: the tiles' jnp contract (laid back out, the same dot) gives the dense logits bit for bit."""
    config = _config(tie_word_embeddings=tied)
    params = _params(config)
    tiled = tile_params(params, AMX, num_devices=1)
    np.testing.assert_array_equal(_forward_logits(config, tiled, REFERENCE), _forward_logits(config, params,
                                                                                             REFERENCE))


@needs_tiled_kernel
@pytest.mark.parametrize("tokens", [8, 1])
def test_the_forward_with_the_native_kernels_matches_the_dense_forward(tokens):
    """8 tokens: the layers' tiled dots on the AMX kernel, q|k|v's rounded to bfloat16 in it (no bias: `linear`),
    gate|up's with the SiLU in it; 1 token (a decode step of one sequence): on the skinny kernel reading the tiles
    (the LM head's one or two rows take the skinny kernel in both)."""
    config = _config()
    params = _params(config)
    tiled = tile_params(params, AMX, num_devices=1)
    kernels = dataclasses.replace(AMX, matvec16="native")
    chunks = [SequenceChunk([5, 90, 33, 2], 0, [1]), SequenceChunk([64], 7, [2])] if tokens == 8 else \
        [SequenceChunk([64], 7, [2])]
    got = _forward_logits(config, tiled, kernels, chunks, tokens)
    want = _forward_logits(config, params, REFERENCE, chunks, tokens)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    text = jit_forward(config, kernels).lower(tiled, init_kv_cache(config, 4, 8, jnp.bfloat16),
                                              build_step_batch(chunks, 8, num_tokens=tokens)).as_text()
    def on_tiles(kernel: str) -> int:  # calls of the kernel on tiles in the layer body that every layer calls
        return sum(f"@{kernel}(" in line and "x2x16x32xbf16>" in line for line in text.splitlines())

    if tokens == 8:  # o and down; q|k|v's sums rounded as stored; gate|up with the SiLU in its epilogue
        assert on_tiles("jaxllm_tiled_matmul") >= 2 and on_tiles("jaxllm_tiled_matmul_bf16") >= 1
        assert on_tiles("jaxllm_tiled_silu_matmul") >= 1
    else:
        assert on_tiles("jaxllm_skinny_matmul") >= 4


def _packed_types(monkeypatch) -> list:
    """The types of the arrays tiled_params packs from now on (numpy: packed on the host), in order."""
    packed, pack = [], tiled_params.pack_tiles
    monkeypatch.setattr(tiled_params, "pack_tiles", lambda w, **k: packed.append(type(w)) or pack(w, **k))
    return packed


@needs_tiled_kernel
def test_an_engine_with_tiled_weights_generates_what_the_dense_one_does(tiny_model_with_tokenizer, monkeypatch):
    import jaxllm.engine.engine as engine_module
    from jaxllm.llm import LLM
    from jaxllm.sampling_params import SamplingParams

    select = engine_module.select_kernels
    outputs = {}
    for choice in ("reference", "cpu"):
        monkeypatch.setattr(engine_module, "select_kernels",
                            lambda *a, **k: dataclasses.replace(select(*a, **k), amx_matmul=choice))
        packed = _packed_types(monkeypatch)  # the engine's own load packs them on the host as it reads them
        llm = LLM(model=str(tiny_model_with_tokenizer), dtype="bfloat16", max_num_seqs=4, max_model_len=64,
                  compilation_cache=False)
        assert packed == ([np.ndarray] * (1 + 4 * 2) if choice == "cpu" else [])  # the head, 4 linears x 2 layers
        head, down = llm.engine.runner.params.embed, llm.engine.runner.params.layers[0].w_down
        assert isinstance(head, weights.TiledWeight) == isinstance(down, weights.TiledWeight) == (choice == "cpu")
        assert llm.engine.loaded.params.embed is head  # one copy of the table
        assert llm.engine.loaded.params.layers[0].w_down is down
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
        together = llm.generate(["Hello there", "1, 2, 3,", "The sky is"], params, use_tqdm=False)
        alone = llm.generate(["Once upon"], params, use_tqdm=False)  # its decode steps: one row, the skinny kernel
        outputs[choice] = together + alone
    for dense, tiled in zip(outputs["reference"], outputs["cpu"]):
        assert dense.outputs[0].token_ids == tiled.outputs[0].token_ids
        for a, b in zip(dense.outputs[0].logprobs, tiled.outputs[0].logprobs):
            assert a.keys() == b.keys()
            assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)


def test_an_engines_draft_model_is_packed_as_it_loads(tiny_model_with_tokenizer, monkeypatch):
    """With the AMX kernel chosen, the draft model of speculative decoding is read as tiles too (the engine is
    only built here: no kernel runs)."""
    import jaxllm.engine.engine as engine_module
    from jaxllm.llm import LLM

    select = engine_module.select_kernels
    monkeypatch.setattr(engine_module, "select_kernels",
                        lambda *a, **k: dataclasses.replace(select(*a, **k), amx_matmul="cpu"))
    packed = _packed_types(monkeypatch)
    spec = {"method": "draft_model", "model": str(tiny_model_with_tokenizer), "num_speculative_tokens": 2}
    llm = LLM(model=str(tiny_model_with_tokenizer), dtype="bfloat16", speculative_config=spec, max_num_seqs=4,
              max_model_len=64, compilation_cache=False)
    assert packed == [np.ndarray] * (2 * (1 + 4 * 2))  # target and draft: the head, 4 linears x 2 layers each
    draft = llm.engine.drafter.runner.params
    assert isinstance(draft.embed, weights.TiledWeight) and isinstance(draft.layers[1].w_qkv, weights.TiledWeight)
