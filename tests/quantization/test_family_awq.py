"""AWQ int4 checkpoints of the families of issue 29 (q/k norms, Gemma's sandwich norms, soft-caps and windows):
`jaxllm quantize --method rtn` writes them (RTN needs no calibration forward), jaxllm loads them with packed
linears, their logits equal a float model of the dequantized weights, and the engine's greedy tokens equal those of
an unquantized directory holding the same weights. `--method awq`, whose calibration forward computes only the
Llama layout, refuses them by name."""

from __future__ import annotations

import numpy as np
import pytest

from jaxllm import LLM, SamplingParams
from jaxllm.entrypoints.cli import main
from jaxllm.loaders import load_host_model, load_model
from jaxllm.model.awq_weight import AWQWeight
from jaxllm.model.params import NORM_FIELDS
from tests.model.test_weight_seam import logits
from tests.quantization.test_awq_loading import FUSED, dequantized_params, write_dequantized_hf_dir
from tests.tiny_models import AWQ_GROUP

FAMILIES = ("qwen3", "gemma2", "gemma3", "mistral_window")
SLOW = pytest.mark.slow  # about 10 s each on CPU
PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 190, 33, 2], [200, 1, 2, 3, 4, 120]]


@pytest.mark.parametrize("family", ["qwen3", "gemma2", pytest.param("gemma3", marks=SLOW),
                                    pytest.param("mistral_window", marks=SLOW)])
def test_logits_equal_the_float_model_of_the_dequantized_weights(family, awq_model_dir, quantizable_model):
    directory = awq_model_dir(family, "rtn")
    loaded = load_model(directory)
    assert loaded.config.architecture == load_host_model(quantizable_model(family)[0]).config.architecture
    linears = [getattr(layer, f) for layer in loaded.params.layers for f in FUSED]
    assert all(isinstance(w, AWQWeight) for w in linears)
    want = logits(loaded.config, dequantized_params(directory, loaded.config))
    np.testing.assert_allclose(logits(loaded.config, loaded.params), want, rtol=0, atol=1e-4)
    assert np.abs(want).max() > 0.1  # the comparison is not between near-zero logits


@pytest.mark.parametrize("family", FAMILIES)
def test_family_norms_are_written_under_the_names_the_loader_reads(family, awq_model_dir, quantizable_model):
    """q/k norms and the sandwich norms come back as they were (to fp16), each in its own field."""
    source = load_host_model(quantizable_model(family)[0], "float32")
    written = load_model(awq_model_dir(family, "rtn"))
    fields = [f for f in NORM_FIELDS if getattr(source.params.layers[0], f) is not None]
    assert len(fields) >= 2
    for i, (a, b) in enumerate(zip(source.params.layers, written.params.layers, strict=True)):
        for field in fields:
            np.testing.assert_allclose(getattr(b, field), getattr(a, field), rtol=1e-3, atol=1e-6,
                                       err_msg=f"layer {i} {field}")


@SLOW
@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_engine_greedy_tokens_equal_the_dequantized_float_model(family, awq_model_dir, tmp_path):
    awq_dir = awq_model_dir(family, "rtn")
    dense_dir = write_dequantized_hf_dir(awq_dir, tmp_path / "dense")
    common = dict(skip_tokenizer=True, max_model_len=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    got = LLM(str(awq_dir), quantization="awq", **common).generate(prompts, params, use_tqdm=False)
    want = LLM(str(dense_dir), **common).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert len({tuple(o.outputs[0].token_ids) for o in got}) == len(PROMPTS)  # not one degenerate sequence


@pytest.mark.parametrize("family", FAMILIES)
def test_method_awq_is_refused_naming_the_family(family, quantizable_model, tmp_path, capsys):
    source, _ = quantizable_model(family)
    out = tmp_path / "out"
    assert main(["quantize", str(source), str(out), "--group-size", str(AWQ_GROUP)]) == 2
    err = capsys.readouterr().err
    architecture = load_host_model(source).config.architecture
    assert f"this is a {architecture} model" in err and "--method rtn" in err, err
    assert not out.exists()
