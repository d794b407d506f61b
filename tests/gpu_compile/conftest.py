"""The GPU-compile tier: the project's kernels and model steps compiled for an H200 (sm_90a) on a machine with no
GPU (deviceless.py). It needs Python >= 3.12 with jax 0.11, the CUDA 13 plugin and ptxas: the README's third
command makes that environment and runs this directory alone (`--confcutdir` keeps the main suite's conftest,
which imports torch, out of it). Anywhere else its tests are reported as skipped, with the reason.

In this tier the project's code runs as on a GPU: `jax.default_backend()` answers "gpu", so every choice between
a Pallas kernel and its CPU path takes the kernel (the local backend is still the CPU, which only traces).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no CUDA client: the H200 devices are compile-only
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # the plugin's check looks for cuDNN, never used

from tests.fake_devices import use_fake_devices  # noqa: E402

use_fake_devices()  # the main suite's tensor-parallel lowering tests, collected here too, need CPU devices

import pytest  # noqa: E402

from tests.gpu_compile import deviceless  # noqa: E402

UNAVAILABLE = deviceless.unavailable_reason()
HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    if UNAVAILABLE is None:
        return
    skip = pytest.mark.skip(reason=f"GPU-compile tier (README: its own environment): {UNAVAILABLE}")
    for item in items:
        if str(item.path).startswith(HERE):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def gpu_code_paths(monkeypatch):
    import jax

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


@pytest.fixture(scope="session")
def h200(tmp_path_factory) -> deviceless.DevicelessH200:
    return deviceless.DevicelessH200(str(tmp_path_factory.mktemp("h200")), num_devices=1)


@pytest.fixture(scope="session")
def h200x2(tmp_path_factory) -> deviceless.DevicelessH200:
    return deviceless.DevicelessH200(str(tmp_path_factory.mktemp("h200x2")), num_devices=2)
