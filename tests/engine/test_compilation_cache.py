"""The directory compiled programs are kept in: on by default, keyed by jax, jaxlib, jaxllm (version and sources)
and the CPU, so that a program built under other key inputs is never loaded, and the same inputs load what was
built."""

from __future__ import annotations

import logging

import jax
import pytest

from jaxllm.engine import compilation_cache
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.sampling_params import SamplingParams

@pytest.fixture
def restore_directory():
    previous = compilation_cache.directory_in_use()
    yield
    compilation_cache.use(previous)


class FromDisk:
    """The step programs loaded from the disk while active (their log lines)."""

    def __init__(self, caplog):
        self.caplog = caplog

    def __enter__(self):
        self.caplog.clear()
        self._level = self.caplog.at_level(logging.INFO, logger="jaxllm.engine.step_programs")
        self._level.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._level.__exit__(*exc_info)

    @property
    def count(self) -> int:
        return sum(r.getMessage().endswith("(from the disk)") for r in self.caplog.records)


def run_engine(model_dir, cache_root) -> None:
    engine = LLMEngine(EngineArgs(model=str(model_dir), max_model_len=64, max_num_seqs=2, skip_tokenizer=True,
                                  compilation_cache_dir=str(cache_root)))
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()


@pytest.mark.parametrize("changed", ["jax", "jaxlib", "jaxllm", "sources", "cpu"])
def test_every_key_input_changes_the_directory(monkeypatch, changed):
    compilation_cache.cache_key.cache_clear()
    before = compilation_cache.cache_directory("/cache")
    target = {"jax": (jax, "__version__"), "jaxlib": (compilation_cache.jaxlib, "__version__"),
              "jaxllm": (compilation_cache.jaxllm, "__version__")}
    if changed in target:
        monkeypatch.setattr(*target[changed], "0.0.0-other")
    elif changed == "sources":
        monkeypatch.setattr(compilation_cache, "source_digest", lambda: "another digest")
    else:
        monkeypatch.setattr(compilation_cache, "cpu_flags", lambda: "flags : another cpu")
    compilation_cache.cache_key.cache_clear()
    after = compilation_cache.cache_directory("/cache")
    monkeypatch.undo()
    compilation_cache.cache_key.cache_clear()
    assert after.parent == before.parent and after != before
    assert compilation_cache.cache_directory("/cache") == before  # the same inputs again: the same directory


def test_the_source_digest_follows_every_source_file(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "kernel.cc").write_text("int f();\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not a source\n")
    first = compilation_cache.digest_sources([tmp_path / "pkg"])
    (tmp_path / "pkg" / "notes.txt").write_text("changed, still not a source\n")
    assert compilation_cache.digest_sources([tmp_path / "pkg"]) == first
    (tmp_path / "pkg" / "kernel.cc").write_text("int f(int);\n")
    assert compilation_cache.digest_sources([tmp_path / "pkg"]) != first


def test_the_default_directory_is_under_the_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXLLM_CACHE_DIR", str(tmp_path))
    directory = compilation_cache.cache_directory(None)
    assert directory.parent == tmp_path / "xla" and directory.name == compilation_cache.cache_key()


def test_only_the_newest_keys_are_kept(tmp_path, restore_directory):
    import os

    for age in range(6):
        old = tmp_path / f"jaxllm-old{age}"
        old.mkdir()
        os.utime(old, (1000 - age, 1000 - age))
    (tmp_path / "user-files").mkdir()  # not a key directory: never removed
    compilation_cache.use(tmp_path / "jaxllm-current")
    kept = sorted(p.name for p in tmp_path.iterdir())
    newest = [f"jaxllm-old{age}" for age in range(compilation_cache.KEEP_KEYS - 1)]
    assert kept == sorted(["jaxllm-current", "user-files", *newest])


@pytest.mark.slow
def test_programs_load_only_under_the_same_key(tiny_model_dir, tmp_path, monkeypatch, caplog, restore_directory):
    model_dir = tiny_model_dir("llama2")[0]
    run_engine(model_dir, tmp_path)  # builds and writes the programs
    key_dir = compilation_cache.cache_directory(str(tmp_path))
    assert any(key_dir.iterdir())
    with FromDisk(caplog) as same_key:
        run_engine(model_dir, tmp_path)
    assert same_key.count > 0  # the control: the same key loads them
    monkeypatch.setattr(compilation_cache, "source_digest", lambda: "jaxllm edited")
    compilation_cache.cache_key.cache_clear()
    try:
        with FromDisk(caplog) as other_key:
            run_engine(model_dir, tmp_path)
        assert other_key.count == 0
        assert compilation_cache.cache_directory(str(tmp_path)) != key_dir
        assert any(compilation_cache.cache_directory(str(tmp_path)).iterdir())
    finally:
        compilation_cache.cache_key.cache_clear()


def test_no_compilation_cache_keeps_nothing(tiny_model_dir, restore_directory, tmp_path):
    compilation_cache.use(tmp_path / "jaxllm-earlier")  # an earlier engine's
    LLMEngine(EngineArgs(model=str(tiny_model_dir("llama2")[0]), max_model_len=64, max_num_seqs=2,
                         skip_tokenizer=True, compilation_cache=False))
    assert compilation_cache.directory_in_use() is None
