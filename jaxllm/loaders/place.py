"""Host params -> device params: the loaders build numpy params on the host; this puts them on their devices.

tensor_parallel.shard_params places them on a mesh: one device by default (each array copied there), or split
over a tensor-parallel mesh, where it lays the params out on the host and hands each device only its own slice, so
no device ever holds the whole model on the way (a whole-model copy on device 0 first would cap the model size at
one device's memory).
"""

from __future__ import annotations

import collections
import math
from typing import Callable

import jax
from jax.sharding import Mesh

from jaxllm.config import ModelConfig
from jaxllm.model import tensor_parallel
from jaxllm.model.params import LlamaParams


def place_params(params: LlamaParams, config: ModelConfig, mesh: Mesh | None = None,
                 on_placed: Callable[[str], None] | None = None) -> LlamaParams:
    """params (numpy, or device arrays in the ordinary layout) on `mesh` (a tensor_parallel.make_mesh mesh;
    default_mesh() when None; ValueError if the model cannot be split over its size). on_placed(path) runs after
    each array is placed."""
    mesh = mesh or tensor_parallel.default_mesh()
    tensor_parallel.check_tp_size(config, mesh.size, mesh.size)
    return tensor_parallel.shard_params(params, config, mesh, on_placed)


def live_bytes_per_device() -> dict[int, int]:
    """Bytes of the live jax arrays on each of this process's devices (device id -> bytes).

    A load-memory gauge that also works where Device.memory_stats() is None (CPU devices): sampled from
    place_params' on_placed, its maximum is the most a device held while loading. Buffers that XLA holds only
    inside a computation are not arrays, so it is a lower bound of a device's use."""
    totals: collections.Counter = collections.Counter()
    for array in jax.live_arrays():
        if array.is_deleted():
            continue
        shard_bytes = math.prod(array.sharding.shard_shape(array.shape)) * array.dtype.itemsize
        for device in array.sharding.addressable_devices:
            totals[device.id] += shard_bytes
    return dict(totals)


class DevicePeak:
    """The most bytes each device held above what it held when this was made, over the calls to sample (pass
    `sample` as place_params' on_placed)."""

    def __init__(self):
        self.baseline = live_bytes_per_device()
        self.peak: dict[int, int] = {}

    def sample(self, _path: str = "") -> None:
        for device, nbytes in live_bytes_per_device().items():
            self.peak[device] = max(self.peak.get(device, 0), nbytes - self.baseline.get(device, 0))
