"""Faults injected on the engine thread through the server's test-only hook (JAXLLM_FAULT_INJECTION=1 in the
server's environment; see jaxllm/entrypoints/openai/fault_injection.py):

    a prompt holding FAULT-IN-STEP  the next engine step raises: the engine's state is unknown, so the loop stops;
                                    every request in flight gets an error (a 5xx in the OpenAI shape, or an SSE
                                    error event that ends the stream), /health answers 503, new requests get a
                                    503, the log holds the traceback, and SIGTERM still stops the server cleanly
    a prompt holding FAULT-IN-ADD   adding that one request raises: it gets a 500 in the OpenAI shape (before any
                                    stream starts), whatever part of it was accepted is aborted, and everything
                                    else keeps being served

Each case has its own server (the first one's engine dies).
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest

from jaxllm.entrypoints.openai.fault_injection import ADD_MARKER, ENV_FLAG, STEP_MARKER
from tests.reliability.helpers import MODEL, assert_error_object, assert_openai_error, sse_events, \
    start_suite_server
from tests.server.helpers import metrics

pytestmark = pytest.mark.slow  # each test starts its own server with faults injected

TIMEOUT = httpx.Timeout(120, connect=10)
LONG = {"model": MODEL, "max_tokens": 200, "ignore_eos": True, "temperature": 0}


@contextlib.contextmanager
def fault_injection():
    """Servers started inside inherit JAXLLM_FAULT_INJECTION=1."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV_FLAG, "1")
        yield


def complete(url: str, prompt, **body) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=TIMEOUT,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 2, **body})


class StreamReader(threading.Thread):
    """Reads one streamed completion in the background; `started` is set at its first token."""

    def __init__(self, url: str, prompt: str):
        super().__init__(daemon=True)
        self.url, self.prompt = url, prompt
        self.started = threading.Event()
        self.status, self.lines = None, []

    def run(self) -> None:
        body = {**LONG, "prompt": self.prompt, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=TIMEOUT) as response:
            self.status = response.status_code
            for line in response.iter_lines():
                self.lines.append(line)
                if line.startswith("data: {") and "choices" in line:
                    self.started.set()
        self.started.set()

    def events(self) -> list:
        return sse_events("\n".join(self.lines))


class Background(threading.Thread):
    """One non-streamed request in the background."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.response = call, None

    def run(self) -> None:
        self.response = self.call()


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_until_idle(url: str) -> dict:
    return wait_for(lambda: (m := metrics(url))["vllm:num_requests_running"] == 0 and
                    m["vllm:num_requests_waiting"] == 0 and m["vllm:kv_cache_usage_perc"] == 0 and m,
                    10, "no request left and every KV block free")


def test_a_fault_in_a_step_fails_the_requests_in_flight_and_health(start_test_server, compilation_cache):
    with fault_injection():
        server = start_suite_server(start_test_server, compilation_cache)
    non_streamed = Background(lambda: complete(server.url, "a non-streamed request in flight", **LONG))
    non_streamed.start()
    stream = StreamReader(server.url, "a streamed request in flight")
    stream.start()
    assert stream.started.wait(90), "the stream never started"
    wait_for(lambda: metrics(server.url)["vllm:num_requests_running"] >= 2, 30, "both requests running")

    faulty = complete(server.url, f"this one breaks the step {STEP_MARKER}")
    non_streamed.join(60)
    stream.join(60)
    assert not non_streamed.is_alive() and not stream.is_alive(), "a request in flight hung after the fault"

    assert faulty.status_code >= 500, faulty.text
    assert_openai_error(faulty)
    assert non_streamed.response.status_code >= 500, non_streamed.response.text
    assert_openai_error(non_streamed.response)
    assert_stream_ended_by_an_error(stream)

    wait_for(lambda: httpx.get(server.url + "/health", timeout=10).status_code == 503, 10, "/health 503")
    refused = complete(server.url, "a request after the engine died")
    assert refused.status_code == 503, refused.text
    assert_openai_error(refused)
    log = server.log_path.read_text()
    assert "Traceback" in log and STEP_MARKER in log, log[-3000:]
    assert server.stop() == 0, server.log()  # SIGTERM still stops it cleanly


def assert_stream_ended_by_an_error(stream: StreamReader) -> None:
    """200 (the stream had started), some tokens, then an SSE error event and nothing but [DONE] after it."""
    assert stream.status == 200
    events = stream.events()
    errors = [i for i, event in enumerate(events) if isinstance(event, dict) and "error" in event]
    assert errors, f"no error event in the stream: {stream.lines[-5:]}"
    assert_error_object(events[errors[0]]["error"])
    tokens_before = [e for e in events[:errors[0]] if isinstance(e, dict) and e.get("choices")]
    assert tokens_before, "the stream was meant to be under way when the step failed"
    after = [e for e in events[errors[0] + 1:] if e != "[DONE]" and e.get("choices")]
    assert not after, f"tokens after the error event: {after[:2]}"
    finishes = [c["finish_reason"] for e in tokens_before for c in e["choices"]]
    assert finishes[-1] is None, "the stream had already finished when the step failed"


@pytest.fixture(scope="module")
def add_faulty(start_module_server, compilation_cache):
    with fault_injection():
        return start_suite_server(start_module_server, compilation_cache)


def test_a_fault_adding_one_request_fails_only_that_request(add_faulty):
    url = add_faulty.url
    stream = StreamReader(url, "a stream that must not notice")
    stream.start()
    assert stream.started.wait(90), "the stream never started"

    failures = [complete(url, f"{ADD_MARKER} number {i}") for i in range(3)]
    failures.append(complete(url, ["a fine prompt first", f"then {ADD_MARKER}"], max_tokens=50, ignore_eos=True))
    failures.append(complete(url, f"streamed {ADD_MARKER}", stream=True))
    for response in failures:
        assert response.status_code == 500, response.text
        assert response.headers["content-type"].startswith("application/json"), response.headers
        assert_openai_error(response)

    stream.join(120)
    assert not stream.is_alive() and stream.status == 200
    events = stream.events()
    assert events[-1] == "[DONE]" and not any("error" in e for e in events if isinstance(e, dict)), stream.lines[-3:]
    assert [c["finish_reason"] for e in events[:-1] for c in e["choices"]][-1] == "length"
    assert events[-2]["usage"]["completion_tokens"] == LONG["max_tokens"]

    ok = complete(url, "a valid request afterwards")
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    wait_until_idle(url)  # the accepted first prompt of the two was aborted: nothing left behind
    log = add_faulty.log_path.read_text()
    assert log.count("Traceback") >= len(failures) and ADD_MARKER in log, log[-3000:]
