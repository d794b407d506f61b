"""What running one model on two processes (jax.distributed, CPU devices, gloo) costs against one process with the
same two devices: decode throughput of the offline API, and the server's per-step broadcast of new requests
(jaxllm/engine/multiprocess_engine.py) for an empty and a 64 KiB message. For the record on CPU; a GPU cluster's
collectives behave differently.

    python benchmarks/multihost_overhead.py [--model DIR]   (default: a tiny random Llama made on the fly)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINE = dict(skip_tokenizer=True, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=160,
              block_size=16, tensor_parallel_size=2)


def worker(model: str, process_id: int | None, address: str | None, devices: int) -> None:
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"

    from jaxllm.llm import LLM
    from jaxllm.sampling_params import SamplingParams

    group = {} if process_id is None else dict(num_processes=2, process_id=process_id, coordinator_address=address)
    llm = LLM(model, **ENGINE, **group)
    prompts = [{"prompt_token_ids": list(range(10 + i, 42 + i))} for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, detokenize=False)
    llm.generate(prompts, params, use_tqdm=False)  # compiles
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    report = {"tok_s": sum(len(o.outputs[0].token_ids) for o in outputs) / seconds}
    if process_id is not None:
        report.update(broadcast_ms(process_id))
    print(json.dumps(report), flush=True)


def broadcast_ms(process_id: int, repeats: int = 50) -> dict:
    from jaxllm.engine.multiprocess_engine import broadcast

    result = {}
    for name, size in (("broadcast_empty_ms", 0), ("broadcast_64k_ms", 64 << 10)):
        message = b"x" * size if process_id == 0 else None
        broadcast(message)  # compiles
        start = time.perf_counter()
        for _ in range(repeats):
            broadcast(message)
        result[name] = 1e3 * (time.perf_counter() - start) / repeats
    return result


def run(model: str, processes: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    commands = [[sys.executable, __file__, "--worker", "--model", model, "--devices", "2"]] if processes == 1 else [
        [sys.executable, __file__, "--worker", "--model", model, "--devices", "1", "--process-id", str(i),
         "--address", address] for i in range(2)]
    procs = [subprocess.Popen(c, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--address")
    args = parser.parse_args()
    if args.worker:
        return worker(args.model, args.process_id, args.address, args.devices)
    model = args.model
    if model is None:
        sys.path.insert(0, str(REPO))
        from tests.tiny_models import save_tiny_hf_model

        model = str(save_tiny_hf_model("llama3", Path(tempfile.mkdtemp()) / "tiny")[0])
    one, two = run(model, 1), run(model, 2)
    print(f"one process, 2 devices:   {one['tok_s']:.0f} tok/s")
    print(f"two processes, 1 device each: {two['tok_s']:.0f} tok/s ({two['tok_s'] / one['tok_s']:.2f}x)")
    print(f"per-step broadcast: empty {two['broadcast_empty_ms']:.2f} ms, 64 KiB {two['broadcast_64k_ms']:.2f} ms")


if __name__ == "__main__":
    main()
