"""GrammarCompiler: a request's constraint compiled for the model's vocabulary, off the engine thread, cached.

xgrammar compiles a parsed grammar against the tokenizer's vocabulary (which tokens can follow which grammar
state); the result is shared by every request with the same constraint text (StructuredOutputsParams.key).
submit() returns at once with a Future; the scheduler admits the request when it is done, so the engine never
waits for a compile. The vocabulary's token table (TokenizerInfo) is built at the first submit; token_bytes() gives
the same vocabulary as bytes (a forced tool call's BudgetCloser splits its closing into tokens with it).
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from jaxllm import optional_deps
from jaxllm.structured_outputs.budget_closing import TokenBytes
from jaxllm.structured_outputs.params import StructuredOutputsParams

CACHE_SIZE = 1024  # compiled grammars kept (least recently used dropped first)


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
        """tokenizer: the engine's Hugging Face tokenizer; vocab_size: the model's logits width (may exceed the
        tokenizer's); stop_token_ids: the ids that end a generation (the grammar allows them where it may end)."""
        if tokenizer is None:
            raise ValueError("structured outputs need a tokenizer; this engine runs without one")
        self._tokenizer, self.vocab_size, self._stop_token_ids = tokenizer, vocab_size, list(stop_token_ids)
        self._compiler = self._info = None
        self._token_bytes: Future | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self._cache: collections.OrderedDict[tuple, Future] = collections.OrderedDict()
        self._lock = threading.Lock()

    def submit(self, params: StructuredOutputsParams) -> Future:
        """The compiled grammar (xgrammar CompiledGrammar) of params, as a Future. Parses first, here (kept on
        params: a server parses on its own threads), so a bad constraint raises ValueError at once."""
        grammar = params.parsed()
        with self._lock:
            future = self._cache.get(params.key)
            if future is not None and not _failed(future):
                self._cache.move_to_end(params.key)
                return future
            future = self._cache[params.key] = self._pool.submit(self._compile, grammar)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return future

    def token_bytes(self) -> Future:
        """The vocabulary as bytes (TokenBytes), as a Future: built once, on the compile thread."""
        with self._lock:
            if self._token_bytes is None:
                self._token_bytes = self._pool.submit(self._build_token_bytes)
            return self._token_bytes

    def _build_token_bytes(self) -> TokenBytes:
        self._xgrammar_compiler()  # builds the TokenizerInfo
        return TokenBytes(self._info.decoded_vocab, self._info.special_token_ids)

    def _compile(self, grammar):
        return self._xgrammar_compiler().compile_grammar(grammar)

    def _xgrammar_compiler(self):
        if self._compiler is None:
            xgr = optional_deps.require("xgrammar", optional_deps.STRUCTURED_OUTPUTS)
            info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self._stop_token_ids)
            self._compiler, self._info = xgr.GrammarCompiler(info, max_threads=2), info
        return self._compiler

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _failed(future: Future) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)
