"""Time to first token and inter-token latency of `jaxllm serve` at a few concurrency levels (loopback only).

    python benchmarks/serving_latency.py [--concurrency 1 16] [--requests-per-level 16] [--max-tokens 64]

Starts a server subprocess on 127.0.0.1 (default model); for each level, one warm-up round (compiling that
level's step shapes), then rounds of that many concurrent streaming greedy completions until
--requests-per-level have completed. TTFT is measured
from sending the request to the first content chunk; ITL is the gap between successive content chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import openai

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, max_num_seqs: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "jaxllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
                             "--port", str(port), "--max-num-seqs", str(max_num_seqs), "--max-model-len", "512"])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("the server did not become healthy within 180 s")


async def one_stream(client: openai.AsyncOpenAI, model: str, max_tokens: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    stamps = []
    stream = await client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0.0,
                                             stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter())
    return stamps[0] - start, list(np.diff(stamps))


async def run_level(url: str, concurrency: int, total: int, max_tokens: int) -> dict:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    ttfts, itls = [], []
    for _ in range(-(-total // concurrency)):
        results = await asyncio.gather(*[one_stream(client, model, max_tokens) for _ in range(concurrency)])
        for ttft, gaps in results:
            ttfts.append(ttft)
            itls += gaps
    await client.close()
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e3  # noqa: E731
    return {"concurrency": concurrency, "requests": len(ttfts), "ttft_p50_ms": pct(ttfts, 50),
            "ttft_p99_ms": pct(ttfts, 99), "itl_p50_ms": pct(itls, 50), "itl_p99_ms": pct(itls, 99)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests-per-level", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    port = free_port()
    server = start_server(port, max_num_seqs=max(args.concurrency))
    url = f"http://127.0.0.1:{port}"
    try:
        rows = []
        for c in args.concurrency:
            asyncio.run(run_level(url, c, c, args.max_tokens))  # warm-up: compile this level's step shapes
            rows.append(asyncio.run(run_level(url, c, args.requests_per_level, args.max_tokens)))
    finally:
        server.terminate()
        server.wait(timeout=60)
    print("\n| concurrent streams | requests | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |\n|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['requests']} | {r['ttft_p50_ms']:.0f} ms | {r['ttft_p99_ms']:.0f} ms | "
              f"{r['itl_p50_ms']:.1f} ms | {r['itl_p99_ms']:.1f} ms |")


if __name__ == "__main__":
    main()
