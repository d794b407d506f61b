"""Load: LOAD_REQUESTS greedy requests at concurrency 16 against one server, half streamed and half not, mixed
completions and chat with varied prompts and lengths. All must answer 200, and each output must equal the same
request's output when it ran alone.

Why equal outputs are the right expectation: greedy decoding takes the argmax of the logits, and the engine's
outputs do not depend on what else is batched with a request (the engine tests compare batched and one-at-a-time
greedy tokens exactly, and so does tests/server/test_concurrency.py over HTTP). Text, finish reason and token
count are compared exactly; a stream's text is its deltas joined, its token count from its usage chunk.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from tests.reliability.helpers import AUTH, MODEL
from tests.server.helpers import metrics

CONCURRENCY = 16
LOAD_REQUESTS = 200
NUM_DISTINCT = 50  # each distinct request runs alone once, then LOAD_REQUESTS / NUM_DISTINCT times under load
TIMEOUT = httpx.Timeout(180, connect=10)
WORDS = "the river carried small boats past the old mill while children counted clouds above green hills".split()


def distinct_requests(rng: random.Random) -> list[tuple[str, dict]]:
    """(path, body) pairs: completions (text or token-id prompts) and chats, greedy, 1 .. 24 new tokens."""
    requests = []
    for i in range(NUM_DISTINCT):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
        common = {"model": MODEL, "temperature": 0, "max_tokens": rng.randint(1, 24),
                  "ignore_eos": rng.random() < 0.5}
        if i % 3 == 2:
            messages = [{"role": "user", "content": f"Question {i}: {words}?"}]
            if rng.random() < 0.5:
                messages.insert(0, {"role": "system", "content": "Answer briefly."})
            requests.append(("/v1/chat/completions", {**common, "messages": messages}))
        elif i % 3 == 1:
            prompt = [rng.randrange(20, 49000) for _ in range(rng.randint(1, 60))]
            requests.append(("/v1/completions", {**common, "prompt": prompt}))
        else:
            requests.append(("/v1/completions", {**common, "prompt": f"Story {i}: {words}"}))
    return requests


def outcome_of_json(path: str, body: dict) -> tuple[str, str, int]:
    choice = body["choices"][0]
    text = choice["message"]["content"] if path.endswith("chat/completions") else choice["text"]
    return text, choice["finish_reason"], body["usage"]["completion_tokens"]


def outcome_of_stream(path: str, lines: list[str]) -> tuple[str, str, int]:
    """(joined text, finish reason, completion tokens) of an SSE stream; raises if it did not end with [DONE]."""
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert lines and lines[-1] == "data: [DONE]", lines[-3:]
    assert not any("error" in event for event in events), events
    text, finish = "", None
    for event in events:
        for choice in event["choices"]:
            delta = choice.get("delta", {}).get("content") if path.endswith("chat/completions") else choice["text"]
            text += delta or ""
            finish = choice["finish_reason"] or finish
    return text, finish, events[-1]["usage"]["completion_tokens"]


async def send(http: httpx.AsyncClient, path: str, body: dict, stream: bool) -> tuple[int, tuple | str]:
    """(status, outcome) of one request; the outcome is the error text when the status is not 200."""
    if not stream:
        response = await http.post(path, json=body)
        if response.status_code != 200:
            return response.status_code, response.text
        return 200, outcome_of_json(path, response.json())
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with http.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            return response.status_code, (await response.aread()).decode()
        lines = [line async for line in response.aiter_lines() if line]
    return 200, outcome_of_stream(path, lines)


async def run_load(url: str, load: list[tuple[int, str, dict, bool]]) -> list[tuple[int, tuple | str]]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=TIMEOUT, limits=limits) as http:
        async def one(path: str, body: dict, stream: bool):
            async with gate:
                return await send(http, path, body, stream)

        return await asyncio.gather(*(one(path, body, stream) for _, path, body, stream in load))


def steps_with_more_than(url: str, n: int) -> float:
    """Engine steps so far that sampled more than n sequences (from the server's histogram)."""
    samples = metrics(url)
    return samples["jaxllm:iteration_num_seqs_count"] - samples[f'jaxllm:iteration_num_seqs_bucket{{le="{float(n)}"}}']


@pytest.mark.slow
def test_concurrent_load_matches_solo_runs(guarded_server, capsys):
    rng = random.Random(1234)
    requests = distinct_requests(rng)
    started = time.monotonic()
    with httpx.Client(base_url=guarded_server.url, headers=AUTH, timeout=TIMEOUT) as http:
        solo = []
        for path, body in requests:
            response = http.post(path, json=body)
            assert response.status_code == 200, response.text
            solo.append(outcome_of_json(path, response.json()))
    solo_s = time.monotonic() - started

    load = [(i % NUM_DISTINCT, *requests[i % NUM_DISTINCT], i % 2 == 1) for i in range(LOAD_REQUESTS)]
    rng.shuffle(load)
    big_steps_before = steps_with_more_than(guarded_server.url, 8)
    started = time.monotonic()
    results = asyncio.run(run_load(guarded_server.url, load))
    load_s = time.monotonic() - started
    with capsys.disabled():
        print(f"\nload: {NUM_DISTINCT} requests alone in {solo_s:.0f}s; {LOAD_REQUESTS} at concurrency {CONCURRENCY} "
              f"in {load_s:.0f}s")

    failed = [(load[i][1], status, outcome) for i, (status, outcome) in enumerate(results) if status != 200]
    assert not failed, f"{len(failed)} requests failed, e.g. {failed[:3]}"
    differ = [(load[i], outcome, solo[load[i][0]]) for i, (_, outcome) in enumerate(results)
              if outcome != solo[load[i][0]]]
    assert not differ, f"{len(differ)} of {LOAD_REQUESTS} outputs differ from the request run alone, e.g. " \
                       f"{differ[:2]}"
    assert steps_with_more_than(guarded_server.url, 8) > big_steps_before, "the load never batched 9+ sequences"
    assert {stream for *_, stream in load} == {True, False}
    assert {path for _, path, _, _ in load} == {"/v1/completions", "/v1/chat/completions"}
