"""The server's tokenizer: one copy per thread, prompt encoding on a worker pool.

Hugging Face fast tokenizers are Rust objects behind a borrow check: two threads using one object at the same time
raise "RuntimeError: Already borrowed". So no tokenizer object is shared between threads here:

    engine thread          the engine's own tokenizer (detokenizing outputs); never touched by the server
    event loop             its own copy (token texts of logprobs, echo)
    tokenize-N workers     one copy each: prompt encoding, /tokenize, /detokenize
    chat-template-N        one ChatRenderer each (its own copy, its child process): chat templates, under their
                           time and memory bound, so a hostile template holds neither a tokenize worker nor longer
                           than its bound

Copies are made from a template taken at start-up, before the engine thread runs. Encoding on the workers keeps a
long prompt's encode off both the event loop (every stream's next chunk) and the engine thread (every step).
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from jaxllm.chat_renderer import DEFAULT_TIMEOUT_S, ChatRenderer

NUM_WORKERS = 2
NUM_RENDERERS = 2

T = TypeVar("T")


class ServerTokenizer:
    def __init__(self, tokenizer, num_workers: int = NUM_WORKERS, template_timeout_s: float = DEFAULT_TIMEOUT_S):
        self._template = None if tokenizer is None else copy.deepcopy(tokenizer)
        self._copy_lock = threading.Lock()
        self._local = threading.local()
        self._workers = ThreadPoolExecutor(num_workers, thread_name_prefix="tokenize")
        self._renderers: queue.Queue[ChatRenderer] = queue.Queue()
        for _ in range(NUM_RENDERERS if tokenizer is not None else 0):
            self._renderers.put(ChatRenderer(copy.deepcopy(tokenizer), template_timeout_s))
        self._render_threads = ThreadPoolExecutor(NUM_RENDERERS, thread_name_prefix="chat-template")

    @property
    def available(self) -> bool:
        return self._template is not None

    def get(self):
        """The calling thread's own tokenizer (None when the server runs without one)."""
        if self._template is None:
            return None
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            with self._copy_lock:
                tokenizer = self._local.tokenizer = copy.deepcopy(self._template)
        return tokenizer

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(tokenizer, *args) on a worker thread, with that worker's tokenizer."""
        return await asyncio.get_running_loop().run_in_executor(self._workers, lambda: fn(self.get(), *args))

    async def chat_prompt_ids(self, messages: Sequence[dict], **template_options) -> list[int]:
        """ChatRenderer.prompt_ids on a chat-template thread."""
        def render() -> list[int]:
            renderer = self._renderers.get()  # as many renderers as threads: one is free
            try:
                return renderer.prompt_ids(messages, **template_options)
            finally:
                self._renderers.put(renderer)

        return await asyncio.get_running_loop().run_in_executor(self._render_threads, render)

    def start_renderers(self) -> None:
        """Start the renderers' child processes in the background (else the first chat requests wait for them)."""
        if self._template is not None and getattr(self._template, "chat_template", None):
            for renderer in list(self._renderers.queue):
                self._render_threads.submit(renderer.start)

    def shutdown(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._render_threads.shutdown(wait=False, cancel_futures=True)
        for renderer in list(self._renderers.queue):
            renderer.close()


def tokenizer_info(tokenizer) -> dict[str, Any]:
    """GET /tokenizer_info (vLLM's): the tokenizer's configuration as JSON: its constructor arguments (special
    tokens as text), its class, chat template and added tokens ({id: {content, special, ...}})."""
    info = {key: _as_json(value) for key, value in tokenizer.init_kwargs.items()}
    info = {key: value for key, value in info.items() if value is not _UNWRITABLE}
    info["tokenizer_class"] = type(tokenizer).__name__
    if isinstance(getattr(tokenizer, "chat_template", None), str):
        info["chat_template"] = tokenizer.chat_template
    info["added_tokens_decoder"] = {str(token_id): dict(token.__getstate__())
                                    for token_id, token in tokenizer.added_tokens_decoder.items()}
    return info


_UNWRITABLE = object()  # a value with no JSON form (the Rust tokenizer object): left out


def _as_json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_as_json(v) for v in value]
        return [v for v in items if v is not _UNWRITABLE]
    if isinstance(value, dict):
        items = {str(k): _as_json(v) for k, v in value.items()}
        return {k: v for k, v in items.items() if v is not _UNWRITABLE}
    content = getattr(value, "content", None)  # an AddedToken: its text
    return content if isinstance(content, str) else _UNWRITABLE

