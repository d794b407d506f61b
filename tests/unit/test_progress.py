"""Progress while loading and compiling: a bar on a terminal, a log line elsewhere, nothing when turned off."""

from __future__ import annotations

import io
import logging

import pytest

from jaxllm import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(items, monkeypatch, stream, **kwargs) -> list:
    monkeypatch.setattr("sys.stderr", stream)
    return list(progress.track(items, "Loading weights", "tensors", total=len(items), **kwargs))


def test_a_terminal_gets_a_bar(monkeypatch):
    terminal = Terminal()
    assert run([b"ab", b"cde"], monkeypatch, terminal, nbytes=len) == [b"ab", b"cde"]
    shown = terminal.getvalue()
    assert "Loading weights" in shown and "/2 " in shown and "tensors" in shown  # redrawn at most every 0.1 s


def test_elsewhere_one_log_line_and_no_bar(monkeypatch, caplog):
    log_file = io.StringIO()
    with caplog.at_level(logging.INFO, logger="jaxllm.progress"):
        run(list(range(5)), monkeypatch, log_file)
    assert log_file.getvalue() == ""
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == ["Loading weights: 5 tensors"]


@pytest.mark.parametrize("stream", [Terminal, io.StringIO])
def test_nothing_when_not_shown(monkeypatch, caplog, stream):
    out = stream()
    with caplog.at_level(logging.INFO, logger="jaxllm.progress"), progress.shown(False):
        assert run([1, 2], monkeypatch, out) == [1, 2]
    assert out.getvalue() == "" and not caplog.records


def test_an_engine_start_reports_loading_and_compiling_unless_disabled(tiny_model_dir, caplog):
    from jaxllm.engine.args import EngineArgs
    from jaxllm.engine.engine import LLMEngine

    args = EngineArgs(model=str(tiny_model_dir("llama2")[0]), max_model_len=32, max_num_seqs=2, skip_tokenizer=True,
                      warmup=True)
    with caplog.at_level(logging.INFO, logger="jaxllm.progress"):
        LLMEngine(args)
    lines = [r.getMessage() for r in caplog.records if r.name == "jaxllm.progress"]
    assert [line.split(":")[0] for line in lines] == ["Loading weights", "Placing weights", "Compiling"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jaxllm.progress"):
        LLMEngine(EngineArgs(**{**args.__dict__, "disable_log_stats": True}))
    assert not [r for r in caplog.records if r.name == "jaxllm.progress"]
