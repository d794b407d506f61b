"""No tokenizer object is used by two threads at once (Hugging Face fast tokenizers raise "Already borrowed" when
that happens), and prompt encoding runs neither on the event loop nor on the engine thread.

The server runs in this process, its engine given a tokenizer that enforces the rule strictly: any call made while
another thread is inside a call on the same object raises, as the Rust borrow check can.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time

import httpx
import pytest
import uvicorn

from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.entrypoints.openai.api_server import build_app
from jaxllm.tokenizer import load_tokenizer
from jaxllm.loaders import resolve_model
from tests.server.conftest import free_port

NUM_REQUESTS = 64
LONG_MESSAGE = "tell me more about " * 40  # ~160 tokens: encoding it takes a while


class BorrowCheckedTokenizer:
    """Forwards to a tokenizer; a method call overlapping another thread's call raises, and every calling
    thread's name is recorded."""

    def __init__(self, inner):
        self._inner, self._lock, self._owner = inner, threading.Lock(), None
        self.threads: set[str] = set()
        self.violations: list[str] = []

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def checked(*args, **kwargs):
            me = threading.current_thread().name
            self.threads.add(me)
            with self._lock:
                if self._owner is not None and self._owner != me:
                    self.violations.append(f"{name} on {me} while {self._owner} is inside a call")
                    raise RuntimeError("Already borrowed")
                outer, self._owner = self._owner, me
            try:
                time.sleep(0.0005)  # widen the window in which an overlap is caught
                return value(*args, **kwargs)
            finally:
                self._owner = outer

        return checked

    def __deepcopy__(self, memo):
        return BorrowCheckedTokenizer(copy.deepcopy(self._inner, memo))

    def __reduce__(self):  # to a chat-template process: a fresh wrapper there
        return BorrowCheckedTokenizer, (self._inner,)


@pytest.fixture(scope="module")
def inprocess_server(tiny_model_with_tokenizer):
    tokenizer = BorrowCheckedTokenizer(load_tokenizer(resolve_model(str(tiny_model_with_tokenizer))))
    engine = LLMEngine(EngineArgs(model=str(tiny_model_with_tokenizer), max_num_seqs=16, max_model_len=256,
                                  max_num_batched_tokens=256), tokenizer=tokenizer)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(engine, ["tiny"]), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the in-process server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", tokenizer
    server.should_exit = True
    thread.join(30)


async def _chat_stream(http: httpx.AsyncClient, url: str, i: int) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"{i}: {LONG_MESSAGE}"}], "max_tokens": 8,
            "temperature": 0, "stream": True, "logprobs": True, "top_logprobs": 2}
    text = []
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            assert '"error"' not in line, line
            if line.startswith("data: {"):
                text.append(line)
    return "".join(text)


async def _tokenize(http: httpx.AsyncClient, url: str, i: int) -> int:
    response = await http.post(url + "/tokenize", json={"prompt": f"{i} {LONG_MESSAGE}"})
    assert response.status_code == 200, response.text
    return response.json()["count"]


@pytest.mark.slow
def test_concurrent_chat_streams_never_share_a_tokenizer(inprocess_server):
    url, engine_tokenizer = inprocess_server

    async def run():
        async with httpx.AsyncClient(timeout=120) as http:
            streams = [_chat_stream(http, url, i) for i in range(NUM_REQUESTS)]
            tokenizes = [_tokenize(http, url, i) for i in range(NUM_REQUESTS // 4)]
            return await asyncio.gather(*streams, *tokenizes)

    results = asyncio.run(run())
    assert all(results)
    assert engine_tokenizer.violations == []
    # the engine's own tokenizer is used only by the engine thread (detokenizing); prompts were encoded elsewhere
    assert engine_tokenizer.threads <= {"engine-loop", "MainThread"}, engine_tokenizer.threads
