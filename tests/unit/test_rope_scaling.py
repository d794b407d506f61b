"""Rope scaling: jaxllm's inverse frequencies and cos/sin factor equal transformers' own rope functions for every
type (several factors and head sizes), and bad rope sections are ModelLoadErrors naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError
from jaxllm.model.layers import rope_inv_freq

BASE = dict(architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=128, intermediate_size=64,
            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
            rope_theta=50000.0)

SCALINGS = {
    "linear": dict(rope_type="linear", factor=4.0),
    "dynamic": dict(rope_type="dynamic", factor=2.0),
    "yarn": dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=512),
    "yarn-mscale": dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=256, mscale=0.707,
                        mscale_all_dim=1.0, beta_fast=24.0, beta_slow=2.0),
    "yarn-attention-factor": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=1024,
                                  attention_factor=1.3, truncate=False),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=512),
}


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("name", SCALINGS)
def test_inverse_frequencies_equal_transformers(name, head_dim):
    hf = {**BASE, "head_dim": head_dim, "rope_scaling": dict(SCALINGS[name])}
    ours, factor = rope_inv_freq(ModelConfig.from_hf_config(hf))
    # HF at the longest sequence the engine runs (max_position_embeddings): dynamic recomputes from the length
    want, want_factor = ROPE_INIT_FUNCTIONS[SCALINGS[name]["rope_type"]](LlamaConfig(**hf), "cpu", seq_len=4096)
    np.testing.assert_allclose(ours, want.numpy(), rtol=2e-6)
    assert factor == pytest.approx(want_factor, rel=1e-6)
    if name != "dynamic":
        default = rope_inv_freq(ModelConfig.from_hf_config({**BASE, "head_dim": head_dim}))[0]
        assert not np.allclose(ours, default)  # the scaling changes the table


def test_longrope_uses_the_short_factors_and_the_attention_factor():
    head_dim = 32
    short, long = [1.0 + i / 10 for i in range(16)], [3.0 + i for i in range(16)]
    hf = {**BASE, "architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "head_dim": head_dim,
          "max_position_embeddings": 8192, "original_max_position_embeddings": 1024,
          "rope_scaling": dict(type="su", short_factor=short, long_factor=long), "pad_token_id": None}
    ours, factor = rope_inv_freq(ModelConfig.from_hf_config(hf))
    hf_config = Phi3Config(**{k: v for k, v in hf.items() if k != "architectures"})
    want, want_factor = ROPE_INIT_FUNCTIONS["longrope"](hf_config, "cpu", seq_len=1024)  # within the original
    np.testing.assert_allclose(ours, want.numpy(), rtol=2e-6)
    assert factor == pytest.approx(want_factor) and factor > 1
    long_table, _ = ROPE_INIT_FUNCTIONS["longrope"](hf_config, "cpu", seq_len=2048)
    assert not np.allclose(ours, long_table.numpy())  # HF switches past the original length; this engine does not


@pytest.mark.parametrize("section,field", [
    (dict(rope_type="ntk-by-parts", factor=2.0), "rope_scaling.rope_type"),
    (dict(type="unknown"), "rope_scaling.type"),
    (dict(rope_type="linear"), "rope_scaling.factor"),
    (dict(rope_type="linear", factor=-2.0), "rope_scaling.factor"),
    (dict(rope_type="yarn", factor=4.0), "rope_scaling.original_max_position_embeddings"),
    (dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0] * 32,
          original_max_position_embeddings=64), "rope_scaling.short_factor"),
    (dict(rope_type="longrope", short_factor=[1.0] * 32, long_factor=["x"] * 32,
          original_max_position_embeddings=64), "rope_scaling.long_factor"),
    (dict(rope_type="linear", factor=2.0, partial_rotary_factor=0.5), "rope_scaling.partial_rotary_factor"),
])
def test_bad_rope_sections_name_the_field(section, field):
    with pytest.raises(ModelLoadError, match=rf"cfg\.json.*{field.replace('.', r'[.]')}"):
        ModelConfig.from_hf_config({**BASE, "head_dim": 64, "rope_scaling": section}, source="cfg.json")
