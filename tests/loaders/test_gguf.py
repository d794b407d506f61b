"""GGUF loader: tensors dequantized, llama.cpp's Q/K row order undone, metadata mapped to ModelConfig."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from transformers import LlamaConfig, LlamaForCausalLM

from jaxllm import ModelLoadError, load_model
from jaxllm.loaders.gguf import unpermute_rope_rows
from tests.tiny_models import permute_rope_rows, write_gguf

GGUF_VARIANTS = ["llama2", "smollm2", "mistral", "qwen2"]  # llama3's rope scaling is a GGUF tensor: refused
# Max abs weight error allowed, as a fraction of the tensor's max abs value, per storage type.
QUANT_TOLERANCE = {Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 1e-2, Q.Q4_0: 0.15, Q.Q4_1: 0.15, Q.Q5_0: 0.08,
                   Q.Q5_1: 0.08}


def _leaves(params):
    return jax.tree_util.tree_leaves_with_path(params)


def test_rope_row_permutation_round_trips():
    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)
    permuted = permute_rope_rows(w, num_heads=4)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute_rope_rows(permuted, num_heads=4), w)
    # within a head, llama.cpp stores the rotary halves interleaved: rows 0, 4, 1, 5, ... of head 0
    np.testing.assert_array_equal(permuted[:8, 0], w[[0, 4, 1, 5, 2, 6, 3, 7], 0])


@pytest.mark.parametrize("gguf_variant", GGUF_VARIANTS)
def test_f32_gguf_equals_safetensors(gguf_variant, tiny_model_dir, tmp_path):
    directory, hf_model = tiny_model_dir(gguf_variant)
    arch = "qwen2" if gguf_variant == "qwen2" else "llama"
    from_gguf = load_model(write_gguf(hf_model, tmp_path / "m.gguf", arch=arch))
    from_hf = load_model(directory)
    assert from_gguf.config.num_heads == from_hf.config.num_heads
    assert from_gguf.config.head_dim == from_hf.config.head_dim
    assert from_gguf.config.tie_word_embeddings == from_hf.config.tie_word_embeddings
    assert from_gguf.config.qkv_bias == from_hf.config.qkv_bias
    for (path, a), (_, b) in zip(_leaves(from_gguf.params), _leaves(from_hf.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("qtype", sorted(QUANT_TOLERANCE, key=lambda q: q.name))
def test_quantized_gguf_dequantizes_close_to_original(qtype, tiny_model_dir, tmp_path):
    directory, hf_model = tiny_model_dir("llama2")
    from_gguf = load_model(write_gguf(hf_model, tmp_path / "m.gguf", matrix_type=qtype))
    from_hf = load_model(directory)
    for (path, a), (_, b) in zip(_leaves(from_gguf.params), _leaves(from_hf.params), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err <= QUANT_TOLERANCE[qtype], f"{jax.tree_util.keystr(path)}: relative error {err:.4f}"


def _kquant_model():
    torch.manual_seed(0)  # every matrix has 256 input columns, the K-quant super-block size
    cfg = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_k_quant_tensors_are_dequantized(qtype, tmp_path):
    """gguf-py cannot quantize K-types, so the test stores random blocks and checks the loader's output equals
    the reference dequantization of the same bytes (with llama.cpp's Q row order undone)."""
    block_bytes = {Q.Q4_K: 144, Q.Q6_K: 210}[qtype]  # bytes per 256-element super-block
    rng = np.random.RandomState(0)
    raw = {name: rng.randint(0, 256, size=(rows, block_bytes), dtype=np.uint8)
           for name, rows in [("blk.0.ffn_up.weight", 256), ("blk.0.attn_q.weight", 256)]}
    for data in raw.values():  # keep the f16 super-block scales finite and small
        scale_at = block_bytes - 2 if qtype == Q.Q6_K else 0
        data[:, scale_at:scale_at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        if qtype == Q.Q4_K:
            data[:, 2:4] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
    path = write_gguf(_kquant_model(), tmp_path / "k.gguf",
                      tensor_overrides={n: (d, qtype) for n, d in raw.items()})
    params = load_model(path).params
    up = dequantize(raw["blk.0.ffn_up.weight"], qtype).reshape(256, 256)
    q = unpermute_rope_rows(dequantize(raw["blk.0.attn_q.weight"], qtype).reshape(256, 256), 4)
    assert np.abs(up).max() > 0
    np.testing.assert_array_equal(np.asarray(params.layers[0].w_gate_up[256:]), up)  # rows: gate, then up
    np.testing.assert_array_equal(np.asarray(params.layers[0].w_qkv[:256]), q)  # rows: q, then k, then v


def test_unsupported_tensor_type_is_named(tmp_path):
    raw = np.zeros((256, 84), np.uint8)  # Q2_K: 84 bytes per 256 elements
    path = write_gguf(_kquant_model(), tmp_path / "q2.gguf",
                      tensor_overrides={"blk.0.ffn_up.weight": (raw, Q.Q2_K)})
    with pytest.raises(ModelLoadError, match=r"q2\.gguf.*blk\.0\.ffn_up\.weight.*unsupported GGUF type Q2_K"):
        load_model(path)


def test_unknown_gguf_architecture(tmp_path, tiny_model_dir):
    _, hf_model = tiny_model_dir("llama2")
    path = write_gguf(hf_model, tmp_path / "gpt.gguf", arch="gpt2")
    with pytest.raises(ModelLoadError, match=r"gpt\.gguf.*unknown architecture 'gpt2'"):
        load_model(path)


def test_truncated_gguf(tmp_path, tiny_model_dir):
    _, hf_model = tiny_model_dir("llama2")
    path = write_gguf(hf_model, tmp_path / "cut.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf.*truncated"):
        load_model(path)
