"""Mixture-of-experts GGUF files as llama.cpp writes them (stacked ffn_*_exps tensors, the router as
ffn_gate_inp, expert_* metadata): the params equal those read from the Hugging Face checkpoint."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from jaxllm import ModelLoadError, load_model
from tests.tiny_models import _COMMON, VARIANTS, write_gguf


def _all_sparse_qwen3_moe(directory):
    """The tiny Qwen3-MoE without its dense layer (llama.cpp has none among sparse ones), saved as safetensors."""
    config_cls, model_cls, overrides = VARIANTS["qwen3_moe"]
    torch.manual_seed(7)
    model = model_cls(config_cls(**{**_COMMON, **overrides, "mlp_only_layers": []})).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    model.save_pretrained(directory)
    return directory, model


@pytest.mark.parametrize("family, arch", [("mixtral", "llama"), ("qwen2_moe", "qwen2moe"),
                                          ("qwen3_moe", "qwen3moe")])
def test_moe_gguf_equals_safetensors(family, arch, tiny_model_dir, tmp_path):
    directory, hf_model = (_all_sparse_qwen3_moe(tmp_path / "hf") if family == "qwen3_moe" else
                           tiny_model_dir(family))
    from_gguf = load_model(write_gguf(hf_model, tmp_path / "m.gguf", arch=arch))
    from_hf = load_model(directory)
    for field in ("architecture", "qkv_bias", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "norm_topk_prob", "shared_expert_intermediate_size", "dense_layers"):
        assert getattr(from_gguf.config, field) == getattr(from_hf.config, field), field
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(from_gguf.params),
                                 jax.tree_util.tree_leaves_with_path(from_hf.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_sigmoid_gating_is_refused(tiny_model_dir, tmp_path):
    import gguf

    _, hf_model = tiny_model_dir("qwen2_moe")
    original = gguf.GGUFWriter.add_expert_count  # the test writer's metadata, plus sigmoid gating

    def add_with_sigmoid(self, count):
        original(self, count)
        self.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)

    gguf.GGUFWriter.add_expert_count = add_with_sigmoid
    try:
        path = write_gguf(hf_model, tmp_path / "sigmoid.gguf", arch="qwen2moe")
    finally:
        gguf.GGUFWriter.add_expert_count = original
    with pytest.raises(ModelLoadError, match="qwen2moe.expert_gating_func 2 is not supported"):
        load_model(path)
