"""The load-memory gauge: how much each device holds while loaders.place_model puts the params on it.

Split over a mesh, no device should ever hold the whole model on the way (a whole-model copy on device 0 first
would cap the model size at one device's memory); this measures it.
"""

from __future__ import annotations

import collections
import math

import jax


def live_bytes_per_device() -> dict[int, int]:
    """Bytes of the live jax arrays on each of this process's devices (device id -> bytes).

    A load-memory gauge that also works where Device.memory_stats() is None (CPU devices): sampled from
    place_model's on_placed, its maximum is the most a device held while loading. Buffers that XLA holds only
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
    `sample` as place_model's on_placed)."""

    def __init__(self):
        self.baseline = live_bytes_per_device()
        self.peak: dict[int, int] = {}

    def sample(self, _path: str = "") -> None:
        for device, nbytes in live_bytes_per_device().items():
            self.peak[device] = max(self.peak.get(device, 0), nbytes - self.baseline.get(device, 0))
