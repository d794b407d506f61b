"""The kernel selection object (jaxllm/model/kernels.py): the one place that reads the backend, each operation's
"auto" choice, and a forced choice that the model's forward really runs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.config import ModelConfig
from jaxllm.engine.args import EngineArgs
from jaxllm.model import Kernels, SequenceChunk, build_step_batch, init_kv_cache, jit_forward, random_params
from jaxllm.model import kernels, select_kernels
from jaxllm.quantization.rtn_params import rtn_awq_params

LIBRARY = Path(kernels.__file__).resolve().parents[1]
ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU backend's choices")


def test_only_the_kernel_selection_reads_the_backend():
    readers = sorted(str(path.relative_to(LIBRARY.parent)) for path in LIBRARY.rglob("*.py")
                     if re.search(r"default_backend\s*\(", path.read_text()))
    assert readers == ["jaxllm/model/kernels.py"]


@ON_CPU
def test_auto_on_cpu_is_the_native_kernels_and_the_jnp_references(monkeypatch):
    monkeypatch.setattr(kernels, "cpu_kernel_error", lambda: None)
    monkeypatch.setattr(kernels, "cpu_write_kv_error", lambda: None)
    monkeypatch.setattr(kernels, "skinny_kernel_error", lambda: None)
    monkeypatch.setattr(kernels, "argmax_kernel_error", lambda: None)
    monkeypatch.setattr(kernels, "silu_and_mul_error", lambda: None)
    monkeypatch.setattr(kernels, "amx_matmul_error", lambda: None)
    monkeypatch.setattr(kernels, "add_rms_norm_error", lambda: None)
    assert select_kernels() == Kernels(attention="cpu", awq_matmul="reference", lora_matmul="reference",
                                       kv_write="cpu", moe="cpu", matvec16="native", argmax="cpu",
                                       silu_and_mul="cpu", amx_matmul="cpu", add_rms_norm="cpu", interpret=True)


@ON_CPU
@pytest.mark.parametrize("error_of,field,fallback", [
    ("skinny_kernel_error", "matvec16", "two_rows"),  # a one-row dot with a 16-bit weight runs as two rows
    ("argmax_kernel_error", "argmax", "reference"),  # the sampler takes jnp.argmax
    ("silu_and_mul_error", "silu_and_mul", "reference"),  # the gated MLP takes jnp
    ("amx_matmul_error", "amx_matmul", "reference"),  # the LM head stays dense
    ("add_rms_norm_error", "add_rms_norm", "reference"),  # the residual add and norm take jnp
])
def test_without_a_native_kernel_its_operation_falls_back(monkeypatch, error_of, field, fallback):
    monkeypatch.setattr(kernels, error_of, lambda: "no compiler, or no AMX-BF16")
    assert getattr(select_kernels(), field) == fallback


def test_auto_on_a_gpu_is_pallas_everywhere(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert select_kernels() == Kernels(attention="pallas", awq_matmul="pallas", lora_matmul="pallas",
                                       kv_write="reference", moe="pallas", interpret=False)


def test_each_operation_can_be_forced(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert select_kernels("reference", "reference", "reference", moe="reference") == Kernels(interpret=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    forced = select_kernels("pallas", "pallas", "pallas", "reference")
    assert (forced.attention, forced.awq_matmul, forced.lora_matmul, forced.kv_write) == ("pallas",) * 3 + \
        ("reference",)
    assert forced.interpret  # no GPU: the Pallas kernels run in interpret mode


@pytest.mark.parametrize("field, value", [("awq_matmul", "cpu"), ("lora_matmul", "triton"), ("kv_write", "pallas")])
def test_an_unknown_implementation_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"{field} implementation '{value}' is unknown"):
        select_kernels(**{field: value})


@pytest.mark.parametrize("field, value", [("awq_matmul", "cpu"), ("lora_matmul", "cuda")])
def test_engine_args_refuse_an_unknown_implementation(field, value):
    with pytest.raises(ValueError, match=f"{field} must be one of auto, pallas, reference; got '{value}'"):
        EngineArgs(**{field: value})


@pytest.mark.slow
def test_the_forced_int4_kernel_runs_in_the_forward_and_matches_the_reference():
    """awq_matmul="pallas" off a GPU: the forward runs the Pallas dequant-matmul (interpret mode), and its logits
    are the reference's; the kernel really ran (its program differs from the reference's)."""
    config = ModelConfig(architecture="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=32)
    params = jax.tree.map(jnp.asarray, rtn_awq_params(random_params(config, jax.random.key(0), jnp.float32,
                                                                    scale=0.1), group_size=32))
    batch = build_step_batch([SequenceChunk([1, 2, 3], 0, [1]), SequenceChunk([4], 5, [2])], 8, num_tokens=8)
    logits = {}
    for name in ("reference", "pallas"):
        chosen = dataclasses.replace(select_kernels("reference"), awq_matmul=name, interpret=True)
        forward = jit_forward(config, chosen)
        if name == "pallas":
            assert forward.lower(params, init_kv_cache(config, 4, 8), batch).as_text() != \
                jit_forward(config, select_kernels("reference")).lower(params, init_kv_cache(config, 4, 8),
                                                                      batch).as_text()
        logits[name], _ = forward(params, init_kv_cache(config, 4, 8), batch)
    np.testing.assert_allclose(np.asarray(logits["pallas"]), np.asarray(logits["reference"]), rtol=2e-4, atol=2e-4)
