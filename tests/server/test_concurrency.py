"""Concurrent streams are batched continuously and give the same text as one-by-one requests; a client that
disconnects mid-stream aborts its request and its KV blocks return to the pool."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.server.helpers import MODEL, async_client, client, metrics

NUM_CONCURRENT = 24


def steps_with_more_than(url: str, n: int) -> float:
    m = metrics(url)
    return m["jaxllm:iteration_num_seqs_count"] - m[f'jaxllm:iteration_num_seqs_bucket{{le="{float(n)}"}}']


async def stream_completion(api, prompt: str, max_tokens: int) -> str:
    stream = await api.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                          stream=True)
    return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])


def test_concurrent_streams_match_sequential_and_are_batched(server):
    """...and compile nothing: the shared server was warmed up (the default) with its whole program set."""
    warmed = metrics(server.url)["jaxllm:compiled_programs"]
    assert warmed == 9 + 5 + 1 + 1  # forward T = 1 .. 256, sample S = 2 .. 32, prompt logprobs, logit-state write
    prompts = [f"Request number {i} says" + " more" * (i % 5) for i in range(NUM_CONCURRENT)]
    sync_api = client(server.url)
    sequential = [sync_api.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0).choices[0].text
                  for p in prompts]
    big_steps_before = steps_with_more_than(server.url, 8)

    async def run_all():
        api = async_client(server.url)
        return await asyncio.gather(*(stream_completion(api, p, 16) for p in prompts))

    concurrent = asyncio.run(run_all())
    assert concurrent == sequential
    assert steps_with_more_than(server.url, 8) > big_steps_before  # many sequences shared a step
    assert metrics(server.url)["jaxllm:compiled_programs"] == warmed


async def _read_stream(http: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, stop_after: int | None):
    """Text of a streamed completion; with stop_after, disconnect after that many chunks."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    text, chunks = "", 0
    async with http.stream("POST", url + "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            text += json.loads(line[6:])["choices"][0]["text"]
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                return None  # leaving the context manager closes the connection
    return text


def test_disconnect_aborts_and_frees_blocks(server):
    kept_prompts = [f"Kept stream {i}" for i in range(4)]
    sync_api = client(server.url)
    expected = [sync_api.completions.create(model=MODEL, prompt=p, max_tokens=48, temperature=0,
                                            extra_body={"ignore_eos": True}).choices[0].text for p in kept_prompts]
    before = metrics(server.url)

    async def run():
        async with httpx.AsyncClient(timeout=120) as http:
            kept = [_read_stream(http, server.url, p, 48, None) for p in kept_prompts]
            dropped = [_read_stream(http, server.url, f"Dropped stream {i}", 200, 3) for i in range(4)]
            return await asyncio.gather(*kept, *dropped)

    results = asyncio.run(run())
    assert results[:4] == expected  # the other streams are unaffected
    deadline = time.monotonic() + 1.0
    while True:  # the aborted requests are gone and every block is back in the pool
        now = metrics(server.url)
        if now["vllm:num_requests_running"] == 0 and now["vllm:kv_cache_usage_perc"] == 0:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.05)
    generated = now["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < 4 * 48 + 4 * 200 / 2  # the dropped requests stopped early
