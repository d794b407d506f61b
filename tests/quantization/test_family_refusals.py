"""AWQ where the formats do not allow it is refused with a message naming the family: Phi-3's fused linears in
an AutoAWQ checkpoint (and jaxllm's quantizer writing one), and --method awq on families its calibration forward
does not compute; jaxllm's quantizer writing a mixture-of-experts model (its AutoAWQ checkpoints load:
test_awq_moe.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from jaxllm import ModelLoadError, load_model
from jaxllm.loaders import load_host_model
from jaxllm.quantization.quantize import quantize_loaded

AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": True, "version": "gemm"}


def test_phi3_awq_checkpoint_is_refused(tiny_model_dir, tmp_path):
    source = tiny_model_dir("phi3")[0]
    target = tmp_path / "phi3-awq"
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "quantization_config": AWQ_CONFIG}))
    with pytest.raises(ModelLoadError, match="AWQ checkpoints of phi3"):
        load_model(target)


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "mistral_window"])
def test_awq_refuses_families_its_forward_does_not_compute(family, tiny_model_dir, tmp_path):
    loaded = load_host_model(tiny_model_dir(family)[0], "float32")
    with pytest.raises(ValueError, match=f"--method awq: .* this is a {loaded.config.architecture} model.*"
                                         f"--method rtn"):
        quantize_loaded(loaded, None, tmp_path / "out", "awq", 16)
    assert not (tmp_path / "out").exists()


def test_phi3_is_refused_by_rtn_too(tiny_model_dir, tmp_path):
    loaded = load_host_model(tiny_model_dir("phi3")[0], "float32")
    with pytest.raises(ValueError, match="AWQ checkpoints of phi3 .*fused"):
        quantize_loaded(loaded, None, tmp_path / "out", "rtn", 16)


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_rtn_of_a_new_family_needs_a_hugging_face_source(family, tiny_model_dir):
    """Without the source's config.json there is none to keep; one is written from scratch only for Llama-layout
    families."""
    from jaxllm.quantization.quantize import check_architecture

    config = load_host_model(tiny_model_dir(family)[0], "float32").config
    check_architecture(config, "rtn", "hf_dir")
    with pytest.raises(ValueError, match=f"quantizing a {family} model needs a Hugging Face directory.*gguf"):
        check_architecture(config, "rtn", "gguf")


@pytest.mark.parametrize("method", ["rtn", "awq"])
def test_moe_models_are_not_quantized(method, tiny_model_dir, tmp_path):
    loaded = load_host_model(tiny_model_dir("qwen2_moe")[0], "float32")
    with pytest.raises(ValueError, match=r"quantizing a mixture-of-experts model \(qwen2_moe\) is not supported"):
        quantize_loaded(loaded, None, tmp_path / "out", method, 16)
    assert not (tmp_path / "out").exists()
