"""`jaxllm quantize` refuses bad input with one clear line (exit status 2) before doing any work."""

from __future__ import annotations

import pytest

from jaxllm.entrypoints.cli import main
from jaxllm.quantization.quantize import quantize_model


def test_group_size_must_divide_every_input_size(quantizable_model, tmp_path, capsys):
    source, _ = quantizable_model("llama2")  # hidden 64, intermediate 128
    out = tmp_path / "out"
    assert main(["quantize", str(source), str(out), "--group-size", "48"]) == 2
    err = capsys.readouterr().err
    assert "model.layers.0.self_attn.q_proj" in err and "K = 64" in err and "group size 48" in err
    assert "16, 32, 64" in err  # the sizes that would work
    assert not out.exists()  # refused before anything was written


def test_default_model_group_size_128_names_the_working_sizes(tmp_path, capsys):
    """The default model's hidden size 576 is not a multiple of 128 (its config alone is read to tell)."""
    assert main(["quantize", "default", str(tmp_path / "out"), "--group-size", "128"]) == 2
    err = capsys.readouterr().err
    assert "K = 576" in err and "group size 128" in err and "16, 32, 64" in err


def test_unknown_method(quantizable_model, tmp_path, capsys):
    source, _ = quantizable_model("llama2")
    with pytest.raises(SystemExit) as exit_info:
        main(["quantize", str(source), str(tmp_path / "out"), "--method", "gptq"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'gptq'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown quantization method 'gptq'; choose one of: awq, rtn"):
        quantize_model(source, tmp_path / "out", method="gptq")


def test_output_dir_must_be_new_or_empty(quantizable_model, tmp_path, capsys):
    source, _ = quantizable_model("llama2")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["quantize", str(source), str(out), "--group-size", "16"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("")
    assert main(["quantize", str(source), str(tmp_path / "file"), "--group-size", "16"]) == 2
    assert "is an existing file" in capsys.readouterr().err


def test_missing_calibration_file(quantizable_model, tmp_path, capsys):
    source, _ = quantizable_model("llama2")
    assert main(["quantize", str(source), str(tmp_path / "out"), "--group-size", "16",
                 "--calibration", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt not found" in capsys.readouterr().err
