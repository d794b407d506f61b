"""Start-up time: `jaxllm generate PROMPT --max-tokens 32` from the shell to its exit, and `jaxllm serve` from
launch until /health answers 200.

    python benchmarks/startup.py                     # generate and serve, each cold then cached; serve --no-warmup
    python benchmarks/startup.py --serve-flags "--warmup" --label "decode warm-up"   # one serve start, these flags

A cold start runs with an empty cache root ($JAXLLM_CACHE_DIR: the native CPU kernels, the compiled programs and
the converted GGUF tokenizer all built there, as on a fresh machine); the cached start is the same command again
with that root. Each start is one fresh process; the default model unless --model. Uses whatever jaxllm is
importable (PYTHONPATH), so an older checkout can be measured with its own flags (an older checkout keeps its
programs only with --compilation-cache-dir: pass it in --serve-flags).
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


def environment(cache_root: str | None) -> dict[str, str]:
    return {**os.environ, **({"JAXLLM_CACHE_DIR": cache_root} if cache_root else {})}


def seconds_to_generate(model: str | None, cache_root: str | None, timeout: float) -> float:
    cmd = [sys.executable, "-m", "jaxllm.entrypoints.cli", "generate", "The capital of France is", "--max-tokens",
           "32", *(["--model", model] if model else [])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environment(cache_root))
    if proc.returncode != 0:
        raise RuntimeError(f"jaxllm generate exited with {proc.returncode}: {proc.stderr[-2000:]}")
    return time.perf_counter() - start


def seconds_to_healthy(model: str | None, flags: list[str], timeout: float, cache_root: str | None = None) -> float:
    port = free_port()
    cmd = [sys.executable, "-m", "jaxllm.entrypoints.cli", "serve", *([model] if model else []), "--port", str(port),
           "--log-level", "warning", *flags]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=environment(cache_root))
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
    runs = []  # (label, command, flags, cache root)
    if args.serve_flags is not None:
        runs.append((args.label, "serve", shlex.split(args.serve_flags), None))
    else:
        generate_root, serve_root = (tempfile.mkdtemp(prefix="jaxllm-startup-") for _ in range(2))
        runs += [("generate, first run (empty cache root)", "generate", [], generate_root),
                 ("generate, second run", "generate", [], generate_root),
                 ("serve, full warm-up, empty cache root", "serve", [], serve_root),
                 ("serve, full warm-up, second start", "serve", [], serve_root),
                 ("serve, no warm-up, second start", "serve", ["--no-warmup"], serve_root)]
    results = []
    print("| start | seconds (generate: to exit; serve: to /health 200) |\n|---|---:|")
    for label, command, flags, root in runs:
        if command == "generate":
            seconds = seconds_to_generate(args.model, root, args.timeout)
        else:
            seconds = seconds_to_healthy(args.model, flags, args.timeout, root)
        results.append({"label": label, "command": command, "flags": flags, "seconds": seconds})
        print(f"| {label} | {seconds:.1f} |", flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"cpus": os.cpu_count(), "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
