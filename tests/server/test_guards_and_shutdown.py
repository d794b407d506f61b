"""API key (401), body size (413), queue length (429 + Retry-After), then SIGTERM: the request in flight
finishes and the process exits 0. One server (started by `jaxllm serve`) with those flags for the whole module;
the last test stops it."""

from __future__ import annotations

import asyncio
import json
import signal
import threading

import httpx
import pytest

from tests.server.helpers import MODEL, client

pytestmark = pytest.mark.slow  # the module's own server, and seconds-long requests

API_KEY = "test-secret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_BODY = 20000


@pytest.fixture(scope="module")
def guarded(start_module_server):
    return start_module_server("--api-key", API_KEY, "--max-num-seqs", "2", "--max-queue-len", "1",
                               "--max-body-bytes", str(MAX_BODY), "--max-model-len", "256", "--shutdown-timeout", "60",
                               via_cli=True)


def complete(server, headers=AUTH, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", headers=headers, timeout=60,
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 2, **body})


def test_api_key(guarded):
    assert complete(guarded, headers={}).status_code == 401
    response = complete(guarded, headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(guarded.url + "/v1/models").status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200  # probes need no key
    assert complete(guarded).status_code == 200
    out = client(guarded.url, api_key=API_KEY).completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert out.usage.completion_tokens == 2


def test_body_too_large_is_413(guarded):
    response = complete(guarded, prompt="x " * MAX_BODY)
    assert response.status_code == 413 and str(MAX_BODY) in response.json()["error"]["message"]

    def chunked(body: bytes):  # no Content-Length: the body streams in chunks
        for i in range(0, len(body), 4096):
            yield body[i:i + 4096]

    headers = {**AUTH, "content-type": "application/json"}
    big = json.dumps({"model": MODEL, "prompt": "x " * MAX_BODY}).encode()
    response = httpx.post(guarded.url + "/v1/completions", content=chunked(big), headers=headers, timeout=60)
    assert response.status_code == 413
    small = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
    response = httpx.post(guarded.url + "/v1/completions", content=chunked(small), headers=headers, timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


def test_queue_full_is_429_with_retry_after(guarded):
    async def burst():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as http:
            body = {"model": MODEL, "prompt": "busy", "max_tokens": 120, "ignore_eos": True}
            return await asyncio.gather(*(http.post(guarded.url + "/v1/completions", json=body) for _ in range(6)))

    responses = asyncio.run(burst())
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 3 and 429 in statuses, statuses  # 2 batch slots + a queue of 1
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["retry-after"] and refused.json()["error"]["type"] == "rate_limit_error"
    assert complete(guarded).status_code == 200


def test_a_request_that_could_never_fit_is_400(guarded):
    """Capacity is 2 batch slots + a queue of 1 = 3 sequences; a request takes n per prompt."""
    never_fits = complete(guarded, n=4, temperature=1)
    assert never_fits.status_code == 400 and never_fits.json()["error"]["param"] == "n", never_fits.text
    prompts = complete(guarded, prompt=["a", "b"], n=2, temperature=1)  # 2 prompts x 2 samples
    assert prompts.status_code == 400, prompts.text
    assert complete(guarded, n=3, temperature=1).status_code == 200


def test_sigterm_finishes_in_flight_request_and_exits_0(guarded):
    first_chunk, result = threading.Event(), {}

    def stream():
        body = {"model": MODEL, "prompt": "long", "max_tokens": 100, "ignore_eos": True, "stream": True}
        tokens = 0
        with httpx.stream("POST", guarded.url + "/v1/completions", json=body, headers=AUTH, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    tokens += 1
                    result["finish_reason"] = choice["finish_reason"]
                    first_chunk.set()
                elif line == "data: [DONE]":
                    result["done"] = True
        result["chunks"] = tokens

    reader = threading.Thread(target=stream)
    reader.start()
    assert first_chunk.wait(60)
    guarded.proc.send_signal(signal.SIGTERM)
    reader.join(120)
    assert result.get("done") and result["finish_reason"] == "length", result
    assert guarded.proc.wait(60) == 0, guarded.log()
