"""The fake CPU devices of the test process. The root conftest asks for them before anything imports JAX (the device
count is fixed when JAX starts), so that tensor-parallel tests run in-process on meshes of jax.devices()[:N]. A
child process inherits the environment: one whose devices must be its own (a process of a multi-process group: the
mesh spans every process's devices) is started with child_environment()."""

from __future__ import annotations

import os
import re

FAKE_DEVICE_COUNT = 8
_FLAG = "--xla_force_host_platform_device_count"


def use_fake_devices(environ=os.environ) -> None:
    """XLA_FLAGS with FAKE_DEVICE_COUNT host devices appended (the last occurrence of a flag wins), and the CPU
    platform unless JAX_PLATFORMS is set."""
    environ["XLA_FLAGS"] = " ".join(filter(None, [environ.get("XLA_FLAGS", ""), f"{_FLAG}={FAKE_DEVICE_COUNT}"]))
    environ.setdefault("JAX_PLATFORMS", "cpu")


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment without the forced host device count (a child gets one CPU device unless it asks
    for more), JAX_PLATFORMS=cpu, and `extra`."""
    env = dict(os.environ)
    flags = re.sub(rf"\s*{_FLAG}=\S*", "", env.get("XLA_FLAGS", "")).strip()
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    return {**env, "JAX_PLATFORMS": "cpu", **extra}
