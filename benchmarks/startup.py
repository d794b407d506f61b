"""Start-up time of `jaxllm serve`: seconds from launching the process until /health answers 200.

    python benchmarks/startup.py                     # cold (full warm-up, empty compilation cache), cached, no warm-up
    python benchmarks/startup.py --serve-flags "--warmup" --label "decode warm-up"   # one start with these flags

The cold start compiles the whole program set and writes it to a fresh persistent compilation cache; the cached
start is the same command again, loading the programs from that cache. Each start is one fresh process (model
load, tokenizer, KV pool, warm-up, server start); the default model unless --model. Uses whatever jaxllm is
importable (PYTHONPATH), so an older checkout can be measured with its own flags.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seconds_to_healthy(model: str | None, flags: list[str], timeout: float) -> float:
    port = free_port()
    cmd = [sys.executable, "-m", "jaxllm.entrypoints.cli", "serve", *([model] if model else []), "--port", str(port),
           "--log-level", "warning", *flags]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while time.perf_counter() - start < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - start
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"not healthy after {timeout} s")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--serve-flags", default=None, help="measure one start with these `jaxllm serve` flags")
    parser.add_argument("--label", default="custom")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    runs = []
    if args.serve_flags is not None:
        runs.append((args.label, shlex.split(args.serve_flags)))
    else:
        cache = tempfile.mkdtemp(prefix="jaxllm-startup-cache-")
        runs += [("cold: full warm-up, empty compilation cache", ["--compilation-cache-dir", cache]),
                 ("cached: full warm-up from the compilation cache", ["--compilation-cache-dir", cache]),
                 ("no warm-up", ["--no-warmup"])]
    results = []
    print("| start | seconds to healthy |\n|---|---:|")
    for label, flags in runs:
        seconds = seconds_to_healthy(args.model, flags, args.timeout)
        results.append({"label": label, "flags": flags, "seconds": seconds})
        print(f"| {label} | {seconds:.1f} |", flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
