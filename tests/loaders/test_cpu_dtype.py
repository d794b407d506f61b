"""dtype="auto" on a CPU: bfloat16 where the CPU's flags name AMX or AVX512-BF16, float32 elsewhere; logged."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest

from jaxllm import load_model
from jaxllm.loaders import cpu_dtype
from jaxllm.loaders.cpu_dtype import cpu_auto_dtype, cpu_flags
from jaxllm.model.params import params_dtype

AMX_XEON = "fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
EPYC_BF16 = "fpu sse avx2 avx512f avx512_bf16 avx512_vnni"
AVX2_ONLY = "fpu sse avx2 fma"


def cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    return path


@pytest.mark.parametrize("flags, expected", [(AMX_XEON, "bfloat16"), (EPYC_BF16, "bfloat16"), (AVX2_ONLY, "float32")])
def test_the_choice_follows_the_flags(tmp_path, flags, expected, caplog):
    with caplog.at_level(logging.INFO, logger="jaxllm.loaders.cpu_dtype"):
        assert cpu_auto_dtype(cpu_flags(cpuinfo(tmp_path, flags))) == expected
    assert f"dtype auto on CPU: {expected}" in caplog.text
    assert ("the CPU has amx_bf16" in caplog.text) == (flags == AMX_XEON)
    assert ("the CPU has avx512_bf16" in caplog.text) == (flags == EPYC_BF16)


def test_the_environment_stands_in_for_the_machines_flags(monkeypatch):
    monkeypatch.delenv(cpu_dtype.FLAGS_ENV)
    assert cpu_dtype.machine_flags() == cpu_flags()
    monkeypatch.setenv(cpu_dtype.FLAGS_ENV, AMX_XEON)
    assert cpu_dtype.machine_flags() == frozenset(AMX_XEON.split()) and cpu_auto_dtype() == "bfloat16"


def test_flags_of_a_missing_or_flagless_file_are_empty(tmp_path):
    assert cpu_flags(tmp_path / "absent") == frozenset()
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "noflags") == frozenset()
    assert cpu_auto_dtype(frozenset()) == "float32"


@pytest.mark.parametrize("flags, expected", [(AMX_XEON, jnp.bfloat16), (EPYC_BF16, jnp.bfloat16), (AVX2_ONLY, jnp.float32)])
def test_load_model_auto_on_cpu_takes_the_flags_choice(tiny_model_dir, monkeypatch, flags, expected):
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    monkeypatch.setenv(cpu_dtype.FLAGS_ENV, flags)
    model_dir = str(tiny_model_dir("llama3")[0])
    assert params_dtype(load_model(model_dir).params) == expected
    assert params_dtype(load_model(model_dir, dtype="float32").params) == jnp.float32  # explicit wins
