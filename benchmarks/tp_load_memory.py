"""Peak bytes on device 0 while loading a model split over N devices, against the model's whole size.

    python benchmarks/tp_load_memory.py                     # a tiny random Llama at N = 1, 2, 4; the default at 1, 3
    python benchmarks/tp_load_memory.py --no-default-model  # the tiny Llama only

Runs on 4 fake CPU devices (set before JAX starts), where Device.memory_stats() reports nothing: the gauge is the
bytes of live arrays per device (jaxllm/benchmarks/load_memory.py), sampled after each array is placed. Paths:
    one device  load_model(model): the whole model on device 0
    sharded     load_model(model, mesh=...): host params, each device receives only its slice
    previous    what the engine did before: the whole model on device 0, laid out there, then jax.device_put
Prints one row per (model, N, path) and a JSON line of the same figures.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

from jaxllm.loaders import load_model  # noqa: E402
from jaxllm.benchmarks.load_memory import DevicePeak  # noqa: E402
from jaxllm.model import tensor_parallel as tp  # noqa: E402
from jaxllm.model.params import param_bytes  # noqa: E402

MiB = 2 ** 20


def one_device(model) -> tuple[object, DevicePeak]:
    gauge = DevicePeak()
    return load_model(model, on_placed=gauge.sample), gauge


def sharded(model, n: int) -> tuple[object, DevicePeak]:
    gauge = DevicePeak()
    return load_model(model, mesh=tp.make_mesh(n), on_placed=gauge.sample), gauge


def previous(model, n: int) -> tuple[object, DevicePeak]:
    gauge = DevicePeak()
    whole = load_model(model, on_placed=gauge.sample)
    laid_out = tp.shard_major_params(whole.params, whole.config, n)  # on device 0
    gauge.sample()
    params = jax.device_put(laid_out, tp.param_shardings(laid_out, tp.make_mesh(n)))
    gauge.sample()
    return params, gauge


def row(name: str, n: int, path: str, run) -> dict:
    gc.collect()
    start = time.perf_counter()
    result, gauge = run()
    seconds = time.perf_counter() - start
    params = getattr(result, "params", result)
    share = sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(params))
    return {"model": name, "N": n, "path": path, "peak_device0": gauge.peak.get(0, 0), "share_device0": share,
            "peak_any_device": max(gauge.peak.values()), "seconds": round(seconds, 2)}


def cases(name: str, model, sizes: list[int]) -> list[dict]:
    whole = param_bytes(load_model(model).params)
    rows = [row(name, 1, "one device", lambda: one_device(model))]
    for n in sizes:
        rows.append(row(name, n, "sharded", lambda: sharded(model, n)))
        if n > 1:
            rows.append(row(name, n, "previous", lambda: previous(model, n)))
    for r in rows:
        r["whole"] = whole
    return rows


def tiny_llama(directory: Path) -> Path:
    from tests.tiny_models import save_tiny_hf_model

    return save_tiny_hf_model("llama2", directory)[0]  # 4 query and 4 KV heads, untied embeddings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-default-model", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = cases("tiny llama", tiny_llama(Path(tmp)), [1, 2, 4])
        if not args.no_default_model:
            rows += cases("default (GGUF)", None, [1, 3])
    print(f"{'model':16} {'N':>2} {'path':11} {'whole MiB':>10} {'peak dev0 MiB':>14} {'share dev0 MiB':>15} "
          f"{'peak/whole':>10} {'s':>6}")
    for r in rows:
        print(f"{r['model']:16} {r['N']:>2} {r['path']:11} {r['whole'] / MiB:>10.3f} {r['peak_device0'] / MiB:>14.3f} "
              f"{r['share_device0'] / MiB:>15.3f} {r['peak_device0'] / r['whole']:>10.3f} {r['seconds']:>6.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
