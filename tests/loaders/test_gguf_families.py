"""GGUF round trip per new family: a tiny HF model written as a llama.cpp conversion lays it out (Gemma's norms
stored as 1 + w, Phi-3's fused attn_qkv / ffn_up and rope factor tensors, Mistral as llama with its window, the
window pattern, soft-caps and second rope base in the metadata) loads into the same model: params equal the
safetensors load and logits equal Hugging Face's."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxllm import ModelLoadError, load_model
from jaxllm.model import SequenceChunk, build_step_batch, init_kv_cache
from jaxllm.model.layers import rope_inv_freq
from tests.model.test_hf_parity import BLOCK_SIZE, F32_TOL, NUM_BLOCKS, hf_logits, model_forward
from tests.tiny_models import write_gguf

FAMILIES = {"mistral_window": "llama", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3"}


def _same_model(a, b) -> None:
    """The configs agree on everything the forward reads; the params agree leaf by leaf."""
    ca, cb = a.config, b.config
    for layer in range(ca.num_layers):
        assert ca.is_sliding(layer) == cb.is_sliding(layer), layer
        for local in (False, True):
            np.testing.assert_allclose(rope_inv_freq(ca, local)[0], rope_inv_freq(cb, local)[0], rtol=1e-6)
            assert rope_inv_freq(ca, local)[1] == pytest.approx(rope_inv_freq(cb, local)[1])
    for name in ("sliding_window", "attn_logit_softcap", "final_logit_softcap", "tie_word_embeddings"):
        assert getattr(ca, name) == getattr(cb, name), name
    assert ca.attention_scale == pytest.approx(cb.attention_scale)
    assert ca.arch == cb.arch or {ca.architecture, cb.architecture} == {"llama", "mistral"}
    leaves = zip(jax.tree_util.tree_leaves_with_path(a.params), jax.tree_util.tree_leaves_with_path(b.params),
                 strict=True)
    for (path, x), (_, y) in leaves:  # Gemma's norms went through 1 + w - 1: float32 rounding
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6, rtol=0, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("family", FAMILIES)
def test_family_gguf_loads_the_same_model(family, tiny_model_dir, tmp_path):
    directory, hf_model = tiny_model_dir(family)
    from_gguf = load_model(write_gguf(hf_model, tmp_path / "m.gguf", arch=FAMILIES[family]))
    _same_model(from_gguf, load_model(directory))
    tokens = np.random.RandomState(5).randint(0, from_gguf.config.vocab_size, size=19)
    batch = build_step_batch([SequenceChunk(tokens, 0, list(range(1, 6)), want_logits="all")], BLOCK_SIZE,
                             num_tokens=32, num_seqs=2, max_blocks=8)
    kv = init_kv_cache(from_gguf.config, NUM_BLOCKS, BLOCK_SIZE)
    logits, _ = model_forward(from_gguf.config)(from_gguf.params, kv, batch)
    np.testing.assert_allclose(np.asarray(logits)[:len(tokens)], hf_logits(hf_model, tokens), atol=F32_TOL, rtol=0)


def test_unsupported_gguf_rope_scaling_is_named(tiny_model_dir, tmp_path):
    import gguf

    _, hf_model = tiny_model_dir("qwen3")
    path = write_gguf(hf_model, tmp_path / "m.gguf", arch="qwen3")
    writer_path = tmp_path / "yarn.gguf"
    # the same model, with a rope scaling type the loader does not read from GGUF metadata
    writer = gguf.GGUFWriter(str(writer_path), arch="qwen3")
    reader = gguf.GGUFReader(str(path))
    for field in reader.fields.values():
        if field.name.startswith("qwen3.") or field.name.startswith("tokenizer."):
            value = field.contents()
            writer.add_key_value(field.name, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data).reshape(list(reversed(tensor.shape.tolist()))))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"qwen3\.rope\.scaling\.type.*yarn.*not supported"):
        load_model(writer_path)
