"""/health reflects a wedged engine; a non-streamed request whose client left is aborted; an unexpected error
answers in the OpenAI shape and leaves the keep-alive connection usable. One server with test-only fault
injection (jaxllm/entrypoints/openai/fault_injection.py) and a 1 s stall timeout."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

from jaxllm.entrypoints.openai.fault_injection import ADD_MARKER, ENV_FLAG, ENV_STALL_S, STALL_MARKER
from tests.server.helpers import MODEL, metrics

pytestmark = pytest.mark.slow  # the module's own server (fault injection), and steps stalled for seconds

STALL_S = 4


@pytest.fixture(scope="module")
def faulty(start_module_server):
    saved = {key: os.environ.get(key) for key in (ENV_FLAG, ENV_STALL_S)}
    os.environ.update({ENV_FLAG: "1", ENV_STALL_S: str(STALL_S)})
    try:
        return start_module_server("--max-num-seqs", "4", "--max-queue-len", "0", "--max-model-len", "256",
                                   "--engine-stall-timeout", "1")
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def complete(server, prompt: str, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 2, **body})


def test_health_is_503_while_a_step_is_stuck(faulty):
    assert httpx.get(faulty.url + "/health").status_code == 200
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("response", complete(faulty, STALL_MARKER)))
    thread.start()
    statuses = []
    while thread.is_alive():
        statuses.append(httpx.get(faulty.url + "/health", timeout=10).status_code)
        time.sleep(0.2)
    thread.join()
    assert result["response"].status_code == 200  # the stalled step ends and its request completes
    assert 503 in statuses and statuses[0] == 200, statuses
    assert httpx.get(faulty.url + "/health").status_code == 200  # healthy again


def test_sequences_in_flight_count_against_capacity(faulty):
    """4 batch slots and no queue: while a stalled step holds 1 + 3 sequences, one more is a 429."""
    async def run():
        async with httpx.AsyncClient(timeout=60) as http:
            def post(prompt: str, n: int):
                return http.post(faulty.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "n": n,
                                                                       "max_tokens": 2, "temperature": 1})
            held = [asyncio.create_task(post(STALL_MARKER, 1))]
            await asyncio.sleep(0.5)  # the stalled step is running
            held.append(asyncio.create_task(post("three samples", 3)))
            await asyncio.sleep(0.5)
            refused = await post("one more", 1)
            return refused, await asyncio.gather(*held)

    refused, held = asyncio.run(run())
    assert refused.status_code == 429, refused.text
    assert [r.status_code for r in held] == [200, 200]


def test_non_streamed_request_is_aborted_when_its_client_leaves(faulty):
    before = metrics(faulty.url)
    body = {"model": MODEL, "prompt": f"left behind {STALL_MARKER}", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # its first step stalls: the client gives up after 1 s and disconnects
        httpx.post(faulty.url + "/v1/completions", json=body, timeout=1.0)
    steps = "jaxllm:iteration_num_seqs_count"
    deadline = time.monotonic() + STALL_S + 60  # the stall, and the first step's compile
    while True:  # a step ran after the stall, and nothing runs any more: aborted, or done with its 200 tokens
        now = metrics(faulty.url)
        if now[steps] > before[steps] and now["vllm:num_requests_running"] == 0 and \
                now["vllm:kv_cache_usage_perc"] == 0:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.05)
    generated = now["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < 200, generated


def test_unexpected_error_is_openai_shaped_and_keeps_the_connection(faulty):
    url = urlparse(faulty.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)

    def post(prompt: str) -> http.client.HTTPResponse:
        connection.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 2}),
                           {"Content-Type": "application/json"})
        return connection.getresponse()

    failed = post(f"one bad request {ADD_MARKER}")
    error = json.loads(failed.read())["error"]
    assert failed.status == 500 and set(error) >= {"message", "type", "param", "code"}, error
    assert "injected fault" in error["message"]
    assert not failed.will_close  # the server keeps the connection open
    ok = post("the next request on the same connection")
    assert ok.status == 200 and json.loads(ok.read())["usage"]["completion_tokens"] == 2
    connection.close()
    assert httpx.get(faulty.url + "/health").status_code == 200
