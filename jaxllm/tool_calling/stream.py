"""ToolParser and ToolCallStream: a format's reading of model output, whole or as it streams.

A format is written once, as a Scanner: a state machine that reads the output from its start, one settled piece
at a time, and tells what each piece is:

    scanner.step(unread, final) -> (characters read, events) | None

`unread` is the output not read yet; `final` says that no more will come. A step reads a prefix of `unread` whose
reading no text that follows can change (or reads nothing and changes the scanner's state), and returns what it
read as events: Content(text), Call(name, arguments) (a call read whole), or CallStart(name) followed by
CallArguments(text) pieces (a call streamed: its arguments handed out as they arrive). None: the step cannot go
on before more text arrives (when `final`: there is nothing left to read).

ToolCallStream drives the scanner over text fed in pieces and turns events into deltas; ToolParser.extract
feeds the whole text as one piece. So a stream's deltas, reassembled, are the extract() of the whole text, however
the text was split.

A call's first delta carries its index, id and name; the next ones its arguments. A format streams a call once
its head (the marker, the name and the opening of the arguments object) has been read: from there it is a call,
and its arguments come in pieces as the model writes them. A call whose head is not in that form is read whole
(handed out once complete and well formed; until then it may still turn out to be content). Content streams as
it comes, except for a tail that may be the start of a marker, and whitespace that may stand before a call (whitespace
next to a call is dropped: whitespace.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar, NamedTuple, Protocol

from jaxllm.tool_calling.calls import ExtractedToolCalls, new_call_id
from jaxllm.tool_calling.deltas import ContentDelta, ToolCallDelta, assemble_tool_deltas
from jaxllm.tool_calling.whitespace import HeldWhitespace


class Content(NamedTuple):
    text: str


class Call(NamedTuple):
    name: str
    arguments: str  # a JSON object, as text


class CallStart(NamedTuple):
    name: str


class CallArguments(NamedTuple):
    text: str  # the next piece of the arguments of the call last started


Event = Content | Call | CallStart | CallArguments
Step = tuple[int, list[Event]]
_MAX_IDLE_STEPS = 8


class Scanner(Protocol):
    def step(self, unread: str, final: bool) -> Step | None: ...


class ToolCallStream:
    """One output's tool calls, read as its text arrives: feed(delta_text) as often as it comes, then finish()."""

    def __init__(self, scanner: Scanner, new_id: Callable[[], str]):
        self._scanner, self._new_id = scanner, new_id
        self._unread = ""
        self._space = HeldWhitespace(at_edge=False)
        self._finished = False
        self.num_tool_calls = 0  # the calls handed out so far

    def feed(self, delta_text: str) -> list[ContentDelta | ToolCallDelta]:
        """The deltas that `delta_text` settles (maybe none: what it brought may still be held back)."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._unread += delta_text
        return self._read(final=False)

    def finish(self) -> list[ContentDelta | ToolCallDelta]:
        """The end of the output: every delta still held back."""
        if self._finished:
            raise RuntimeError("finish() twice")
        self._finished = True
        deltas = self._read(final=True)
        tail = self._space.flush()
        return deltas + [ContentDelta(tail)] if tail else deltas

    def _read(self, final: bool) -> list[ContentDelta | ToolCallDelta]:
        deltas: list[ContentDelta | ToolCallDelta] = []
        idle = 0  # steps in a row that read and settled nothing (each changes the scanner's state: a few at most)
        while (step := self._scanner.step(self._unread, final)) is not None:
            read, events = step
            idle = 0 if read or events else idle + 1
            if idle > _MAX_IDLE_STEPS:
                raise RuntimeError(f"{type(self._scanner).__name__} makes no progress (a bug)")
            self._unread = self._unread[read:]
            for event in events:
                deltas += self._deltas(event)
        return deltas

    def _deltas(self, event: Event) -> list[ContentDelta | ToolCallDelta]:
        if isinstance(event, Content):
            text = self._space.push(event.text)
            return [ContentDelta(text)] if text else []
        if isinstance(event, CallArguments):
            return [ToolCallDelta(self.num_tool_calls - 1, event.text)] if event.text else []
        self._space.edge()
        index = self.num_tool_calls
        self.num_tool_calls += 1
        head = ToolCallDelta(index, "", id=self._new_id(), name=event.name)
        return [head] if isinstance(event, CallStart) else [head, ToolCallDelta(index, event.arguments)]


class ToolParser(ABC):
    """A tool-call format. Parsers hold no state of their own: one serves every request."""

    name: ClassVar[str]

    @abstractmethod
    def scanner(self) -> Scanner:
        """A new scanner, at the start of an output."""

    def new_call_id(self) -> str:
        return new_call_id()

    def stream(self) -> ToolCallStream:
        """A stream for one output."""
        return ToolCallStream(self.scanner(), self.new_call_id)

    def extract(self, text: str) -> ExtractedToolCalls:
        """The content and calls of a whole output. Never raises: text that is no well-formed call is content."""
        stream = self.stream()
        return assemble_tool_deltas(stream.feed(text) + stream.finish())
