"""Compiled step programs kept on disk whole (engine/program_cache.py): a second start loads every program
without tracing, runs the same tokens, and a program is found only under everything that determines it."""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from jaxllm.compile_counter import CompileCounter
from jaxllm.engine import compilation_cache, program_cache
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.engine.step_programs import StepPrograms
from jaxllm.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]


@pytest.fixture
def restore_jax_cache():
    previous = jax.config.jax_compilation_cache_dir, compilation_cache.directory_in_use()
    yield
    jax.config.update("jax_compilation_cache_dir", previous[0])
    jax_cache.reset_cache()
    compilation_cache.use(previous[1])


def start_and_run(model_dir, cache_root) -> tuple[list[list[int]], int]:
    """(greedy tokens of PROMPTS, programs the warm-up obtained) from a fresh engine."""
    args = EngineArgs(model=str(model_dir), max_model_len=64, max_num_seqs=2, skip_tokenizer=True, warmup=True,
                      compilation_cache_dir=str(cache_root))
    with CompileCounter() as built:
        engine = LLMEngine(args)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=6, temperature=0.0))
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
    return [tokens[str(i)] for i in range(len(PROMPTS))], built.count


def test_a_second_start_loads_every_program_and_runs_the_same_tokens(tiny_model_dir, tmp_path, caplog,
                                                                    restore_jax_cache):
    model_dir = tiny_model_dir("llama2")[0]
    first, _ = start_and_run(model_dir, tmp_path)
    caplog.clear()  # the first start's lines too, where an earlier test left jaxllm's loggers at INFO
    with caplog.at_level(logging.INFO, logger="jaxllm.engine.step_programs"):
        second, built_second = start_and_run(model_dir, tmp_path)
    built = [r.getMessage() for r in caplog.records if r.getMessage().startswith("built program")]
    assert built and all(m.endswith("(from the disk)") for m in built)
    assert second == first
    assert built_second >= len(built)  # each program loaded from the disk counts as a program obtained


def test_a_program_that_fails_to_load_is_compiled_again(tiny_model_dir, tmp_path, caplog, restore_jax_cache):
    model_dir = tiny_model_dir("llama2")[0]
    first, _ = start_and_run(model_dir, tmp_path)
    kept = list(tmp_path.rglob("*" + program_cache.SUFFIX))
    assert kept
    for path in kept:
        path.write_bytes(b"truncated")
    with caplog.at_level(logging.WARNING, logger="jaxllm.engine.program_cache"):
        second, _ = start_and_run(model_dir, tmp_path)
    assert second == first
    assert sum("could not be loaded" in r.getMessage() for r in caplog.records) == len(kept)


def test_a_program_jaxs_own_cache_served_is_not_kept(tiny_model_dir, tmp_path, restore_jax_cache):
    """With JAX's persistent cache switched on as well (by the user), a program it serves is not written out: XLA
    would write it without its compiled functions, and loading it would fail at its first run."""
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax_cache.reset_cache()
    model_dir = tiny_model_dir("llama2")[0]
    first, _ = start_and_run(model_dir, tmp_path / "one")  # compiled: kept in both caches
    second, _ = start_and_run(model_dir, tmp_path / "two")  # served by JAX's cache: not kept
    kept_one = list((tmp_path / "one").rglob("*" + program_cache.SUFFIX))
    kept_two = list((tmp_path / "two").rglob("*" + program_cache.SUFFIX))
    assert len(kept_two) < len(kept_one)  # what JAX's cache served was not kept (whatever it missed was)
    third, _ = start_and_run(model_dir, tmp_path / "two")  # loads what "two" kept: each runs
    assert first == second == third


def _key(identity=("forward", 8), args=None, xla_flags=None, monkeypatch=None):
    if xla_flags is not None:
        monkeypatch.setenv("XLA_FLAGS", xla_flags)
    args = args if args is not None else (jax.ShapeDtypeStruct((8, 4), jnp.float32), {"b": np.zeros(3, np.int32)})
    return program_cache.program_key(identity, args)


def test_the_key_follows_identity_arguments_and_flags(monkeypatch):
    base = _key()
    assert _key() == base
    assert _key(identity=("forward", 16)) != base
    assert _key(args=(jax.ShapeDtypeStruct((8, 4), jnp.bfloat16), {"b": np.zeros(3, np.int32)})) != base
    assert _key(args=(jax.ShapeDtypeStruct((8, 5), jnp.float32), {"b": np.zeros(3, np.int32)})) != base
    assert _key(args=(jax.ShapeDtypeStruct((8, 4), jnp.float32), {"c": np.zeros(3, np.int32)})) != base
    assert _key(args=(jax.ShapeDtypeStruct((8, 4), jnp.float32), [np.zeros(3, np.int32)])) != base
    assert _key(xla_flags="--xla_cpu_enable_fast_math=true", monkeypatch=monkeypatch) != base


def test_the_identity_holds_the_config_the_kernels_and_the_devices(tiny_model_dir):
    from jaxllm.engine.bucketing import ProgramKey
    from jaxllm.loaders import load_host_model
    from jaxllm.model.kernels import select_kernels

    config = load_host_model(str(tiny_model_dir("llama2")[0])).config

    def identity(config=config, kernels=select_kernels("reference", "auto", "auto")):
        programs = StepPrograms(config, kernels, buckets=None, max_blocks_per_seq=4)
        return (ProgramKey("forward", 8), *programs._closure)

    base = program_cache.program_key(identity(), ())
    assert program_cache.program_key(identity(), ()) == base
    assert program_cache.program_key(identity(config=dataclasses.replace(config, rms_norm_eps=1e-3)), ()) != base
    assert program_cache.program_key(identity(kernels=select_kernels("cpu", "auto", "auto")), ()) != base
    devices = identity()[-1]
    assert devices and all(len(d) == 3 for d in devices)  # id, platform and kind of every device of the mesh
