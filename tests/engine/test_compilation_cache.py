"""The persistent compilation cache: on by default, keyed by jax, jaxlib, jaxllm (version and sources) and the CPU,
so that a program built under other key inputs is never loaded, and the same inputs load what was built."""

from __future__ import annotations

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from jaxllm.engine import compilation_cache
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.sampling_params import SamplingParams

CACHE_HITS_EVENT = "/jax/compilation_cache/cache_hits"


@pytest.fixture
def restore_jax_cache():
    previous = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", previous)
    jax_cache.reset_cache()


class CacheHits:
    def __init__(self):
        self.count = 0

    def _listen(self, event: str, **kwargs) -> None:
        self.count += event == CACHE_HITS_EVENT

    def __enter__(self):
        jax.monitoring.register_event_listener(self._listen)
        return self

    def __exit__(self, *exc_info):
        jax.monitoring.unregister_event_listener(self._listen)


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


def test_only_the_newest_keys_are_kept(tmp_path, restore_jax_cache):
    import os

    for age in range(6):
        old = tmp_path / f"jaxllm-old{age}"
        old.mkdir()
        os.utime(old, (1000 - age, 1000 - age))
    (tmp_path / "user-files").mkdir()  # not a key directory: never removed
    compilation_cache.enable(tmp_path / "jaxllm-current")
    kept = sorted(p.name for p in tmp_path.iterdir())
    newest = [f"jaxllm-old{age}" for age in range(compilation_cache.KEEP_KEYS - 1)]
    assert kept == sorted(["jaxllm-current", "user-files", *newest])


@pytest.mark.slow
def test_programs_load_only_under_the_same_key(tiny_model_dir, tmp_path, monkeypatch, restore_jax_cache):
    model_dir = tiny_model_dir("llama2")[0]
    run_engine(model_dir, tmp_path)  # builds and writes the programs
    key_dir = compilation_cache.cache_directory(str(tmp_path))
    assert any(key_dir.iterdir())
    with CacheHits() as same_key:
        run_engine(model_dir, tmp_path)
    assert same_key.count > 0  # the control: the same key loads them
    monkeypatch.setattr(compilation_cache, "source_digest", lambda: "jaxllm edited")
    compilation_cache.cache_key.cache_clear()
    try:
        with CacheHits() as other_key:
            run_engine(model_dir, tmp_path)
        assert other_key.count == 0
        assert compilation_cache.cache_directory(str(tmp_path)) != key_dir
        assert any(compilation_cache.cache_directory(str(tmp_path)).iterdir())
    finally:
        compilation_cache.cache_key.cache_clear()


def test_no_compilation_cache_leaves_jax_alone(tiny_model_dir, restore_jax_cache):
    jax.config.update("jax_compilation_cache_dir", None)
    LLMEngine(EngineArgs(model=str(tiny_model_dir("llama2")[0]), max_model_len=64, max_num_seqs=2,
                         skip_tokenizer=True, compilation_cache=False))
    assert jax.config.jax_compilation_cache_dir is None
