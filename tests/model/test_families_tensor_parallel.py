"""Each new family split over N = 2 fake CPU devices gives the logits of N = 1 (float32, reference attention):
its q/k norms and post-norms replicated, its heads and MLP columns split (Gemma 3's single KV head replicated)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxllm import load_model
from jaxllm.model import select_kernels
from jaxllm.model import tensor_parallel as tp
from tests.model.test_tensor_parallel import BLOCK_SIZE, LOGITS_TOLERANCE, NUM_BLOCKS, run
from tests.tiny_models import NEW_FAMILIES


def logits_at(loaded, n: int) -> list[np.ndarray]:
    mesh = tp.make_mesh(n)
    params = tp.shard_params(loaded.params, loaded.config, mesh)
    kv = tp.init_kv_cache(loaded.config, NUM_BLOCKS, BLOCK_SIZE, mesh=mesh)
    forward = tp.jit_forward(loaded.config, select_kernels(attention="reference"), mesh=mesh)
    return run(forward, params, kv, "reference")


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_two_devices_equal_one(family, tiny_model_dir):
    loaded = load_model(tiny_model_dir(family)[0])
    want = logits_at(loaded, 1)
    for got, expected in zip(logits_at(loaded, 2), want, strict=True):
        np.testing.assert_allclose(got, expected, atol=LOGITS_TOLERANCE, rtol=0)
