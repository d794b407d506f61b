"""The test process's fake CPU devices (tests/fake_devices.py, asked for by tests/conftest.py): tensor-parallel tests
run in-process on them, the engine's default mesh stays on one device, and a child process gets one device unless it
asks for more."""

from __future__ import annotations

import os

import jax
import pytest

from jaxllm.model import tensor_parallel as tp
from tests.fake_devices import FAKE_DEVICE_COUNT, child_environment, use_fake_devices


def test_the_test_process_has_the_fake_devices_and_the_default_mesh_one():
    if os.environ.get("JAX_PLATFORMS") != "cpu":
        pytest.skip(f"the tests run on JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')}")
    assert jax.device_count() == FAKE_DEVICE_COUNT == 8
    assert tp.default_mesh().devices.size == 1
    assert tp.make_mesh(4).devices.tolist() == jax.devices()[:4]


def test_fake_devices_are_appended_to_the_flags_and_a_platform_set_is_kept():
    environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/x", "JAX_PLATFORMS": "cuda"}
    use_fake_devices(environ)
    assert environ == {"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8",
                       "JAX_PLATFORMS": "cuda"}
    environ = {}
    use_fake_devices(environ)
    assert environ == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def test_a_child_environment_drops_the_device_count(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8")
    env = child_environment(OUT="out")
    assert (env["XLA_FLAGS"], env["JAX_PLATFORMS"], env["OUT"]) == ("--xla_dump_to=/tmp/x", "cpu", "out")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert "XLA_FLAGS" not in child_environment()
