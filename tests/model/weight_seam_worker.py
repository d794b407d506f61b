"""Run in a subprocess with 4 fake CPU devices (the device count is fixed when JAX starts): the tensor-parallel
forward with the test-only weight formats of test_weight_seam.py against the dense single-device forward. Prints one
JSON object {"FORMAT/tpN": max abs difference of the logits}.

    python -m tests.model.weight_seam_worker
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402

import numpy as np  # noqa: E402

from jaxllm.model import tensor_parallel as tp  # noqa: E402
from jaxllm.model.kernels import REFERENCE  # noqa: E402
from tests.model.test_weight_seam import FORMATS, batch, config, convert, dense_logits, dense_params  # noqa: E402


def main() -> None:
    cfg = config(qkv_bias=True, architecture="qwen2")  # 2 KV heads: split at N = 2, replicated at N = 4
    params, want = dense_params(cfg), dense_logits(cfg)
    diffs = {}
    for name, to_format in FORMATS.items():
        for n in (2, 4):
            mesh = tp.make_mesh(n)
            sharded = tp.shard_params(convert(params, to_format), cfg, mesh)
            got, _ = tp.jit_forward(cfg, REFERENCE, mesh=mesh)(
                sharded, tp.init_kv_cache(cfg, 6, 4, mesh=mesh), batch())
            diffs[f"{name}/tp{n}"] = float(np.abs(np.asarray(got) - want).max())
    print(json.dumps(diffs))


if __name__ == "__main__":
    main()
