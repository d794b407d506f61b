"""config.json -> ModelConfig for the new families: HF's defaults (which layers are local, soft-caps, attention
scale, rope bases), and every bad value a ModelLoadError naming the file and the field."""

from __future__ import annotations

import pytest

from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError

COMMON = dict(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=7, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16)


def read(arch: str, **fields) -> ModelConfig:
    return ModelConfig.from_hf_config({"architectures": [arch], **COMMON, **fields}, source="cfg.json")


def sliding(config: ModelConfig) -> list[bool]:
    return [config.is_sliding(i) for i in range(config.num_layers)]


def test_gemma2_defaults_alternate_local_layers_and_cap_both_logits():
    c = read("Gemma2ForCausalLM", sliding_window=4)
    assert sliding(c) == [True, False] * 3 + [True]
    assert (c.attn_logit_softcap, c.final_logit_softcap) == (50.0, 30.0)
    assert c.attention_scale == 256 ** -0.5 and c.tie_word_embeddings
    assert read("Gemma2ForCausalLM", final_logit_softcapping=None).final_logit_softcap is None  # null: off


def test_gemma3_pattern_and_rope_bases():
    c = read("Gemma3ForCausalLM", sliding_window=8, sliding_window_pattern=3, rope_local_base_freq=20.0)
    assert sliding(c) == [True, True, False, True, True, False, True]
    assert (c.rope_theta, c.rope_local_theta, c.attn_logit_softcap) == (1_000_000.0, 20.0, None)
    nested = read("Gemma3ForCausalLM", rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    assert (nested.rope_theta, nested.rope_local_theta, nested.rope_scaling.factor) == (5e5, 1e4, 8.0)


def test_qwen3_window_only_with_use_sliding_window_and_from_max_window_layers():
    assert read("Qwen3ForCausalLM", sliding_window=4).sliding_window is None
    c = read("Qwen3ForCausalLM", sliding_window=4, use_sliding_window=True, max_window_layers=5)
    assert sliding(c) == [False] * 5 + [True] * 2


def test_mistral_and_phi3_windows_cover_every_layer():
    assert all(sliding(read("MistralForCausalLM", sliding_window=3)))
    assert all(sliding(read("Phi3ForCausalLM", sliding_window=3)))
    assert read("LlamaForCausalLM", sliding_window=3).sliding_window is None  # HF Llama has no window


@pytest.mark.parametrize("arch,fields,field", [
    ("Gemma2ForCausalLM", dict(layer_types=["sliding_attention"] * 3), "layer_types"),
    ("Gemma3ForCausalLM", dict(layer_types=["chunked_attention"] * 7), "layer_types"),
    ("Gemma2ForCausalLM", dict(attn_logit_softcapping=-1.0), "attn_logit_softcapping"),
    ("Gemma2ForCausalLM", dict(query_pre_attn_scalar="big"), "query_pre_attn_scalar"),
    ("Gemma2ForCausalLM", dict(hidden_activation="relu"), "hidden_activation"),
    ("Qwen3ForCausalLM", dict(hidden_act="gelu"), "hidden_act"),
    ("Gemma3ForCausalLM", dict(sliding_window=0), "sliding_window"),
    ("Gemma3ForCausalLM", dict(sliding_window_pattern=0), "sliding_window_pattern"),
    ("Gemma3ForCausalLM", dict(rope_local_base_freq=float("inf")), "rope_local_base_freq"),
    ("Phi3ForCausalLM", dict(partial_rotary_factor=0.75), "partial_rotary_factor"),
    ("Gemma3ForCausalLM", dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
     "rope_parameters.sliding_attention.rope_type"),
])
def test_bad_values_name_the_file_and_field(arch, fields, field):
    with pytest.raises(ModelLoadError, match=rf"cfg\.json.*{field.replace('.', '[.]')}"):
        read(arch, **fields)


def test_multimodal_gemma3_is_refused_as_unknown():
    with pytest.raises(ModelLoadError, match="unknown architecture.*Gemma3ForConditionalGeneration"):
        read("Gemma3ForConditionalGeneration")
