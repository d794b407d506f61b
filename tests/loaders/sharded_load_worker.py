"""Run in a subprocess with 4 fake CPU devices (the device count is fixed when JAX starts): load models split over
N devices and measure what device 0 held on the way. Prints one JSON object {"NAME/tpN": row}, row:
    peak       most bytes of live arrays on device 0 during the load (sampled after each array is placed)
    share      device 0's bytes once loaded
    replicated bytes of the arrays every device holds whole
    laid_out   bytes of the loaded params, each array counted once
    whole      bytes of the same model loaded on one device
    equal      the values and shardings equal the previous path's: loaded whole on one device, laid out there
               (tensor_parallel.shard_major_params on device arrays), then split with jax.device_put
    previous_peak  device 0's peak along that previous path (the gauge sees a whole-model copy)

    python -m tests.loaders.sharded_load_worker NAME=MODEL=N,N ...
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxllm.loaders import load_model  # noqa: E402
from jaxllm.loaders.place import DevicePeak  # noqa: E402
from jaxllm.model import tensor_parallel as tp  # noqa: E402
from jaxllm.model.params import param_bytes  # noqa: E402


def measure(model: str, n: int) -> dict:
    mesh = tp.make_mesh(n)
    device0 = mesh.devices.flat[0].id
    gauge = DevicePeak()
    loaded = load_model(model, mesh=mesh, on_placed=gauge.sample)
    gauge.sample()
    leaves = jax.tree.leaves(loaded.params)
    row = {"peak": gauge.peak.get(device0, 0),
           "share": sum(leaf.addressable_shards[0].data.nbytes for leaf in leaves),
           "replicated": sum(leaf.nbytes for leaf in leaves if leaf.sharding.is_fully_replicated),
           "laid_out": sum(leaf.nbytes for leaf in leaves)}
    previous = DevicePeak()
    whole = load_model(model, on_placed=previous.sample)
    row["whole"] = param_bytes(whole.params)
    laid_out = tp.shard_major_params(whole.params, whole.config, n)
    previous.sample()
    reference = jax.device_put(laid_out, tp.param_shardings(laid_out, mesh))
    previous.sample()
    row["previous_peak"] = previous.peak.get(device0, 0)  # above what the sharded load left there
    row["equal"] = all(a.sharding == b.sharding and a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
                       for a, b in zip(leaves, jax.tree.leaves(reference), strict=True))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="NAME=MODEL=N,N,...")
    args = parser.parse_args()
    results = {}
    for case in args.cases:
        name, model, sizes = case.split("=")
        for n in map(int, sizes.split(",")):
            results[f"{name}/tp{n}"] = measure(model, n)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
