"""What the reliability modules share: the suite's server settings, the OpenAI error-shape check, SSE parsing."""

from __future__ import annotations

import json
import httpx

from tests.server.conftest import SERVED_NAME, ServerProcess

MODEL = SERVED_NAME
API_KEY = "reliability-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_MODEL_LEN = 256
MAX_BODY_BYTES = 1 << 20  # room for deeply nested JSON (100k levels is ~200 KB) to reach the JSON parser
# One engine configuration for every server of the suite, so that the compilation cache the first one fills
# serves the others; no warm-up: a server compiles the programs its requests need.
ENGINE_FLAGS = ("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16", "--max-num-batched-tokens", "128")
ERROR_FIELDS = {"message", "type", "param", "code"}


def start_suite_server(start_server, compilation_cache: str, *flags: str) -> ServerProcess:
    """A server with the suite's engine flags and compilation cache, plus `flags`."""
    return start_server(*ENGINE_FLAGS, "--compilation-cache-dir", compilation_cache, *flags)


def assert_openai_error(response: httpx.Response) -> dict:
    """The body is {"error": {"message": str, "type": str, "param": ..., "code": ...}}: message and type non-empty,
    param null or naming where the request is wrong (not a copy of the message)."""
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"status {response.status_code}: the body is not JSON: {response.text[:300]!r}")
    assert isinstance(body, dict) and set(body) == {"error"}, body
    return assert_error_object(body["error"])


def assert_error_object(error) -> dict:
    """The inner object of an OpenAI error body (also what an SSE error event carries)."""
    assert isinstance(error, dict) and set(error) >= ERROR_FIELDS, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    param = error["param"]
    assert param is None or (isinstance(param, str) and param and param != error["message"]), \
        f"param should name where the request is wrong, or be null: {error}"
    return error


def sse_events(text: str) -> list:
    """The payloads of an SSE body's `data:` lines, parsed; the final "[DONE]" is kept as that string."""
    events = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events
