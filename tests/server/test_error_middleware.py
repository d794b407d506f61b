"""An exception no handler takes becomes a 500 in the OpenAI error shape and the keep-alive connection survives
(Starlette's last-resort handler answers "Internal Server Error" as plain text and the server then closes the
connection). A tiny app served by uvicorn in this process; no model."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI

from jaxllm.entrypoints.openai.errors import UnexpectedErrorsAsOpenAIErrors
from tests.server.conftest import free_port


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/boom")
    async def boom():
        raise KeyError("a bug in a handler")

    @app.get("/ok")
    async def ok():
        return {"ok": True}

    app.add_middleware(UnexpectedErrorsAsOpenAIErrors)
    return app


@pytest.fixture(scope="module")
def port():
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(10)


def test_unhandled_exception_is_a_500_in_openai_shape_on_a_kept_connection(port):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/boom")
    failed = connection.getresponse()
    body = json.loads(failed.read())
    assert failed.status == 500
    assert body["error"]["type"] == "server_error" and "KeyError" in body["error"]["message"]
    assert not failed.will_close
    sock = connection.sock
    connection.request("GET", "/ok")
    ok = connection.getresponse()
    assert ok.status == 200 and json.loads(ok.read()) == {"ok": True}
    assert connection.sock is sock  # the same socket carried both requests
    connection.close()
