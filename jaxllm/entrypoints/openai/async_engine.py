"""AsyncEngine: the LLMEngine driven by one background thread, fed by many asyncio request handlers.

    handlers (event loop)                         engine thread
    add_request() -("add", ...)-> inbox --------> engine.add_request (an error goes back to that handler only)
    stream closed -("abort", id)-> inbox -------> engine.abort_request (blocks freed before the next step)
    call(fn) -----("call", fn)-> inbox ---------> fn(engine), e.g. add_lora / remove_lora; its result or error
                                                  goes back to the caller
    per-request asyncio.Queue <- call_soon_threadsafe <- step() outputs (delta kind)

The engine itself is single-threaded: only the engine thread touches it. Inbox commands are applied between
steps, so every step batches all the requests that are running at that moment (continuous batching).

Failures: a request the engine refuses (ValueError) or fails to add (any other exception, logged with its
traceback) ends that request only. An exception inside step() leaves the engine's state unknown: the loop stops,
every request in flight gets an EngineDeadError, and /health answers 503 (`health_problem`), as it does while one
step has run longer than `stall_timeout_s` (a wedged engine).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, AsyncIterator, Callable, TypeVar

from jaxllm.entrypoints.openai.fault_injection import FaultInjector
from jaxllm.entrypoints.openai.metrics import RequestTracker, ServerMetrics
from jaxllm.lora.request import LoRARequest
from jaxllm.outputs import RequestOutput
from jaxllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

IDLE_POLL_S = 0.05
DEFAULT_STALL_TIMEOUT_S = 120.0  # one step running longer than this makes /health answer 503

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    pass


class QueueFullError(RuntimeError):
    pass


class RequestFailedError(RuntimeError):
    """The engine thread failed to add one request for a reason that is not the request's fault."""


_ACCEPTED = object()  # the engine thread took the request


class RequestStream:
    """The delta outputs of one accepted request. Closing it before the last output (client gone) aborts the
    request, which frees its KV blocks before the next step."""

    def __init__(self, engine: "AsyncEngine", request_id: str, num_seqs: int, outputs: asyncio.Queue):
        self.engine, self.request_id, self.num_seqs, self._outputs = engine, request_id, num_seqs, outputs
        self.finished = False
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                item = await self._outputs.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finished
                yield item
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.release(self.request_id, self.num_seqs, self.finished)


@dataclasses.dataclass
class _Reply:
    """Where the engine thread sends items for a handler waiting on the event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclasses.dataclass
class _Stream(_Reply):
    tracker: RequestTracker


@dataclasses.dataclass(frozen=True)
class _Returned:
    """What a call's function returned (so that a returned exception object is not taken for a failure)."""

    value: Any


class AsyncEngine:
    def __init__(self, engine, metrics: ServerMetrics, max_queue_len: int | None = None,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S):
        self.engine = engine
        self.metrics = metrics
        self.max_queue_len = max_queue_len
        self.max_num_seqs = engine.scheduler_config.max_num_seqs
        self.stall_timeout_s = stall_timeout_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._num_in_flight = 0  # event loop only: sequences accepted and not yet finished or aborted
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._heartbeat = time.monotonic()  # the engine thread's last pass through its loop
        self._faults = FaultInjector.from_env()
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ event-loop side
    def start(self) -> None:
        self.metrics.record_engine(self.engine.stats())
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def health_problem(self) -> str | None:
        """Why the engine cannot serve (dead, or stuck in one step), or None when it is healthy."""
        if self.error is not None:
            return f"the engine loop died: {self.error!r}"
        if not self._thread.is_alive():
            return "the engine loop is not running"
        silent_s = time.monotonic() - self._heartbeat
        if silent_s > self.stall_timeout_s:
            return f"the engine has been inside one step for {silent_s:.0f}s (stall timeout {self.stall_timeout_s}s)"
        return None

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the thread after its current step, aborting what is left (call once the HTTP server drained)."""
        self._stopping.set()
        self._thread.join(timeout)

    def check_capacity(self, num_seqs: int) -> None:
        """Sequences count (a request samples best_of of them). Raise ValueError when `num_seqs` could never fit
        in the batch slots plus the queue, QueueFullError when they do not fit now."""
        if self.max_queue_len is None:
            return
        capacity = self.max_num_seqs + self.max_queue_len
        if num_seqs > capacity:
            raise ValueError(f"n: this request needs {num_seqs} sequences; the server holds at most {capacity} "
                             f"({self.max_num_seqs} batch slots + a queue of {self.max_queue_len})")
        if self._num_in_flight + num_seqs > capacity:
            self.metrics.admission_rejections.inc()
            raise QueueFullError(f"the server is at capacity: {self._num_in_flight} sequences in flight "
                                 f"({self.max_num_seqs} batch slots + a queue of {self.max_queue_len})")

    async def add_request(self, request_id: str, prompt, params: SamplingParams,
                          lora_request: LoRARequest | None = None, priority: int = 0) -> "RequestStream":
        """Submit a request (run with `lora_request`'s adapter, or the base model for None; `priority` for the
        scheduler's priority policy) and wait until the engine thread accepted it (between two steps). Raises
        ValueError for an invalid request, QueueFullError, EngineDeadError, or RequestFailedError."""
        if not self.is_alive:
            raise EngineDeadError("the engine loop is not running")
        num_seqs = params.num_sequences
        self.check_capacity(num_seqs)
        arrays = await self._adapter_arrays(lora_request)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), RequestTracker(time.monotonic()))
        handle = RequestStream(self, request_id, num_seqs, stream.queue)
        self._inbox.put(("add", request_id, prompt, params, lora_request, arrays, priority, stream))
        self._num_in_flight += num_seqs
        try:
            first = await stream.queue.get()
        except BaseException:
            handle.close()
            raise
        if isinstance(first, BaseException):
            handle.finished = True
            handle.close()
            raise first
        return handle

    async def _adapter_arrays(self, lora_request: LoRARequest | None):
        """The adapter's files read here, on a worker thread, when the engine does not hold its arrays (new, or
        evicted from its host cache), so that the engine thread reads no file; None when it holds them. A file
        that cannot be read is a ValueError for this request alone."""
        manager = getattr(self.engine, "lora", None)
        if lora_request is None or manager is None or manager.is_held(lora_request.lora_int_id):
            return None
        return await asyncio.get_running_loop().run_in_executor(None, manager.read_arrays, lora_request)

    async def call(self, fn: Callable[[Any], T]) -> T:
        """fn(engine) on the engine thread, between two steps (the engine is only ever touched there); returns
        what it returned. A ValueError it raises is raised here; any other exception is logged and raised as a
        RequestFailedError (the engine keeps running); EngineDeadError when the engine loop is not running."""
        if not self.is_alive:
            raise EngineDeadError("the engine loop is not running")
        reply = _Reply(asyncio.get_running_loop(), asyncio.Queue())
        self._inbox.put(("call", fn, reply))
        item = await reply.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item.value

    def release(self, request_id: str, num_seqs: int, finished: bool) -> None:
        """A RequestStream is done with: abort its request in the engine unless it finished."""
        self._num_in_flight -= num_seqs
        if not finished:
            self._inbox.put(("abort", request_id))

    # ------------------------------------------------------------------ engine-thread side
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                busy = self.engine.has_unfinished_requests()
                self._apply_commands(block=not busy)
                generated = self._step() if self.engine.has_unfinished_requests() else 0
                self.metrics.record_engine(self.engine.stats(), generated)
                self._heartbeat = time.monotonic()
            self._abort_remaining()
        except BaseException as e:  # noqa: BLE001 - any failure kills the loop; /health reports it
            logger.exception("the engine loop died")
            self.error = e
            self._fail_all(EngineDeadError(f"the engine loop died: {e!r}"))

    def _abort_remaining(self) -> None:
        """At shutdown: the server already waited for its requests, so whatever is left has no one waiting."""
        self._apply_commands(block=False)
        for request_id in list(self._streams):
            self.engine.abort_request(request_id)
        self._fail_all(EngineDeadError("the server is shutting down"))
        self.metrics.record_engine(self.engine.stats())

    def _fail_all(self, error: EngineDeadError) -> None:
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        while True:  # requests submitted but never applied
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            if command[0] in ("add", "call"):
                command[-1].put(error)

    def _apply_commands(self, block: bool) -> None:
        try:
            command = self._inbox.get(timeout=IDLE_POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, command: tuple) -> None:
        if command[0] == "abort":
            request_id = command[1]
            if self._streams.pop(request_id, None) is not None:
                self.engine.abort_request(request_id)
            return
        if command[0] == "call":
            self._call(*command[1:])
            return
        _, request_id, prompt, params, lora_request, arrays, priority, stream = command
        options = {} if lora_request is None else {"lora_request": lora_request}  # the base model: as before
        if arrays is not None:
            options["lora_arrays"] = arrays
        if priority:
            options["priority"] = priority
        try:
            if self._faults is not None:
                self._faults.before_add(prompt)
            self.engine.add_request(request_id, prompt, params, arrival_time=stream.tracker.arrival_time,
                                    output_kind="delta", **options)
        except ValueError as e:
            stream.put(e)
            return
        except Exception as e:  # noqa: BLE001 - not the request's fault, but only this request fails
            logger.exception("adding request %s failed", request_id)
            self.engine.abort_request(request_id)  # whatever part of it the engine took
            stream.put(RequestFailedError(f"the engine failed to add the request: {e!r}"))
            return
        self._streams[request_id] = stream
        self.metrics.record_request(params)
        stream.put(_ACCEPTED)

    def _call(self, fn: Callable[[Any], Any], reply: _Reply) -> None:
        try:
            reply.put(_Returned(fn(self.engine)))
        except ValueError as e:
            reply.put(e)
        except Exception as e:  # noqa: BLE001 - the caller's command failed; the engine keeps running
            logger.exception("an engine command failed")
            reply.put(RequestFailedError(f"the engine command failed: {e!r}"))

    def _step(self) -> int:
        """One engine step; its outputs to their streams. Returns the tokens it generated."""
        if self._faults is not None:
            self._faults.before_step()
        outputs = self.engine.step()
        sampled = sum(len(output.outputs) for output in outputs)
        if sampled:
            self.metrics.step_seqs.observe(sampled)
        now = time.monotonic()
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            self.metrics.record_output(output, stream.tracker, now)
            if output.finished:
                del self._streams[output.request_id]
            stream.put(output)
        return sum(len(c.token_ids) for output in outputs for c in output.outputs)
