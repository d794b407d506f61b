"""The greedy loop equals Hugging Face greedy generate; `jaxllm generate` prints a continuation or a clear error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from jaxllm import load_model
from jaxllm.entrypoints.cli import main
from tests.greedy_reference import greedy_generate


def test_batched_greedy_equals_hf_generate(tiny_model_dir):
    directory, hf_model = tiny_model_dir("llama3")
    loaded = load_model(directory)
    rng = np.random.RandomState(5)
    prompts = [rng.randint(3, 256, size=n).tolist() for n in (5, 17, 9)]
    ours = greedy_generate(loaded, prompts, max_tokens=12, block_size=4)
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                                    do_sample=False, pad_token_id=0)
        assert got == out[0, len(prompt):].tolist()


def test_greedy_stops_at_stop_token(tiny_model_dir):
    loaded = load_model(tiny_model_dir("llama2")[0])
    full = greedy_generate(loaded, [[5, 6, 7]], max_tokens=6)[0]
    stopped = greedy_generate(loaded, [[5, 6, 7]], max_tokens=6, stop_token_ids=[full[2]])[0]
    assert stopped == full[:full.index(full[2]) + 1]


def test_greedy_rejects_too_long_request(tiny_model_dir):
    loaded = load_model(tiny_model_dir("llama2")[0])
    with pytest.raises(ValueError, match=r"prompt \+ max_tokens = 266 tokens exceeds the model's context of 256"):
        greedy_generate(loaded, [[1] * 10], max_tokens=256)


@pytest.mark.slow
def test_cli_generate_default_model(capsys):
    assert main(["generate", "The capital of France is", "--max-tokens", "4"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_cli_reports_bad_model_without_traceback(capsys, tmp_path):
    assert main(["generate", "hi", "--model", str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxllm: error: ") and "missing.gguf: no such file or directory" in err


# Runs the CLI with the arguments after -c as if PyTorch were not installed: importing torch fails and
# importlib.util.find_spec("torch"), which transformers asks, answers None.
CLI_WITHOUT_TORCH = ("import sys; sys.modules['torch'] = None; from jaxllm.entrypoints.cli import main; "
                     "sys.exit(main(sys.argv[1:]))")


@pytest.mark.slow
def test_cli_without_torch_prints_no_pytorch_advice(tiny_model_with_tokenizer):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_")}
    result = subprocess.run([sys.executable, "-c", CLI_WITHOUT_TORCH, "generate", "Hello", "--model",
                             str(tiny_model_with_tokenizer), "--max-tokens", "2", "--max-model-len", "64"],
                            capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "PyTorch was not found" not in result.stderr
    assert "[2 tokens from 1 prompts" in result.stderr  # the CLI's own report still shows


@pytest.mark.parametrize("flags, defaults, expected", [
    ([], {}, dict(max_tokens=32, temperature=0.0, top_p=1.0, top_k=0)),  # no generation config: greedy, 32
    ([], {"temperature": 0.6, "top_p": 0.9, "max_tokens": 100, "min_p": 0.1},
     dict(max_tokens=100, temperature=0.6, top_p=0.9, top_k=0, min_p=0.1)),
    (["--temperature", "0", "--max-tokens", "5"], {"temperature": 0.6, "top_p": 0.9, "max_tokens": 100},
     dict(max_tokens=5, temperature=0.0, top_p=1.0)),  # greedy: top_p back to 1
    (["--top-k", "3"], {"temperature": 0.6, "top_k": 20}, dict(max_tokens=32, temperature=0.6, top_k=3)),
])
def test_generate_flags_given_then_the_generation_config_then_its_own_defaults(flags, defaults, expected):
    from jaxllm.entrypoints.cli import _sampling_params, build_parser

    params = _sampling_params(build_parser().parse_args(["generate", "hi", *flags]), defaults)
    assert {name: getattr(params, name) for name in expected} == expected


@pytest.mark.slow
def test_cli_generate_takes_max_new_tokens_from_the_generation_config(tiny_model_with_tokenizer, tmp_path, capsys):
    model = shutil.copytree(tiny_model_with_tokenizer, tmp_path / "model")
    (model / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3, "temperature": 0.0}))
    args = ["generate", "Hello", "--model", str(model), "--max-model-len", "64"]
    for flags, tokens in (([], 3), (["--max-tokens", "5"], 5), (["--generation-config", "vllm"], 32)):
        assert main([*args, *flags]) == 0
        assert f"[{tokens} tokens from 1 prompts" in capsys.readouterr().err


def test_cli_names_a_missing_generation_config_before_loading(tiny_model_dir, tmp_path, capsys):
    model, missing = tiny_model_dir("llama2")[0], tmp_path / "nowhere"
    capsys.readouterr()  # writing the model's files reports progress
    assert main(["generate", "hi", "--model", str(model), "--generation-config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxllm: error: {missing / 'generation_config.json'}: not found: generation_config "
                          "takes 'auto'") and err.count("\n") == 1


@pytest.mark.parametrize("args, code, stream, text", [
    (["generate", "Hello", "--max-tokens", "2", "--max-model-len", "64"], 0, "stderr", "[2 tokens from 1 prompts"),
    (["generate", "Hello", "--max-model-len", "0"], 2, "stderr", "jaxllm: error: "),
])
def test_the_command_exits_with_mains_code_and_its_output_flushed(tiny_model_with_tokenizer, args, code, stream,
                                                                   text):
    """run() leaves without the interpreter's teardown: what main printed still arrives, with main's exit code."""
    result = subprocess.run([sys.executable, "-m", "jaxllm.entrypoints.cli", *args, "--model",
                             str(tiny_model_with_tokenizer)], capture_output=True, text=True, timeout=600)
    assert result.returncode == code, result.stderr[-2000:]
    assert text in getattr(result, stream)
    if code == 0:
        assert result.stdout.endswith("\n")  # the generated text's line (a random model's text may be blank)
