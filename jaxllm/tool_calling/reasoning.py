"""Reasoning parsers: a reasoning model's output split into its reasoning and its answer (vLLM's
--reasoning-parser names; OpenAI's reasoning_content beside content).

    deepseek_r1   <think>reasoning</think>answer   the opening tag may be absent (the chat template writes it into
                                                   the prompt): everything before </think> is reasoning, and all
                                                   of an output without </think> (it stopped while thinking)
    qwen3         <think>reasoning</think>answer   reasoning only when the output opens with <think> (after
                                                   whitespace); otherwise all of it is content. For the Qwen3
                                                   models whose template writes <think> into the prompt, use
                                                   deepseek_r1.

With thinking disabled (enable_thinking=False, as in chat_template_kwargs) all of the output is content. The
reasoning is stripped of the whitespace around it, the answer of the whitespace it opens with; either is None when
empty. extract() reads a whole output, stream() one that arrives in pieces: its deltas, reassembled, give the
extract() of the whole text however it was split (a tail that may be the start of a tag is held back).
"""

from __future__ import annotations

from typing import NamedTuple

from jaxllm.tool_calling.deltas import ContentDelta, ReasoningDelta
from jaxllm.tool_calling.markers import leading_space, starts_with, text_before_marker
from jaxllm.tool_calling.whitespace import HeldWhitespace

OPEN, CLOSE = "<think>", "</think>"
START, REASONING, CONTENT = "start", "reasoning", "content"


class ReasoningSplit(NamedTuple):
    reasoning_content: str | None
    content: str | None


class ReasoningParser:
    """A reasoning format (no state of its own: one serves every request)."""

    end = CLOSE  # the text after which the answer begins (a constraint on the answer waits for it)

    def __init__(self, name: str, *, opens_implicitly: bool):
        self.name = name
        self.opens_implicitly = opens_implicitly  # the output is reasoning from its start, <think> or not

    def stream(self, *, enable_thinking: bool = True) -> ReasoningStream:
        return ReasoningStream(self.opens_implicitly, enable_thinking)

    def extract(self, text: str, *, enable_thinking: bool = True) -> ReasoningSplit:
        stream = self.stream(enable_thinking=enable_thinking)
        return assemble_reasoning_deltas(stream.feed(text) + stream.finish())


class ReasoningStream:
    """One output's reasoning and content, read as its text arrives: feed(delta_text), then finish()."""

    def __init__(self, opens_implicitly: bool, enable_thinking: bool):
        self._opens_implicitly = opens_implicitly
        self._state = START if enable_thinking else CONTENT
        self._unread = ""
        self._reasoning = HeldWhitespace(at_edge=True)
        self._content_opens = False  # the content follows </think>: its leading whitespace is dropped

    @property
    def reasoning_ended(self) -> bool:
        """Whether all that follows is content (a tool-call parser may read it)."""
        return self._state == CONTENT

    def feed(self, delta_text: str) -> list[ContentDelta | ReasoningDelta]:
        self._unread += delta_text
        return self._read(final=False)

    def finish(self) -> list[ContentDelta | ReasoningDelta]:
        return self._read(final=True)

    def _read(self, final: bool) -> list[ContentDelta | ReasoningDelta]:
        deltas: list[ContentDelta | ReasoningDelta] = []
        while True:
            if self._state == START and not self._start(final):
                return deltas
            if self._state == REASONING and not self._read_reasoning(final, deltas):
                return deltas
            if self._state == CONTENT:
                self._read_content(deltas)
                return deltas

    def _start(self, final: bool) -> bool:
        """Whether the output's opening is settled: <think>, or (more text) no <think>."""
        space = leading_space(self._unread)
        opens = starts_with(self._unread[space:], OPEN, final)
        if opens is None:
            return False
        if opens:
            self._unread = self._unread[space + len(OPEN):]
        self._state = REASONING if opens or self._opens_implicitly else CONTENT
        return True

    def _read_reasoning(self, final: bool, deltas: list) -> bool:
        """Reads reasoning up to </think>; whether it was found."""
        read, text, found = text_before_marker(self._unread, CLOSE, final)
        self._unread = self._unread[read:]
        if text := self._reasoning.push(text):
            deltas.append(ReasoningDelta(text))
        if found:
            self._state, self._content_opens = CONTENT, True
        return found

    def _read_content(self, deltas: list) -> None:
        text, self._unread = self._unread, ""
        if self._content_opens:
            text = text.lstrip()
            self._content_opens = not text
        if text:
            deltas.append(ContentDelta(text))


def assemble_reasoning_deltas(deltas: list[ContentDelta | ReasoningDelta]) -> ReasoningSplit:
    """The reasoning and content that a reasoning stream's deltas add up to."""
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    return ReasoningSplit(reasoning or None, content or None)


_PARSERS = {"deepseek_r1": True, "qwen3": False}  # name -> opens_implicitly
REASONING_PARSERS = tuple(sorted(_PARSERS))


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The reasoning parser called `name`; ValueError naming the known ones otherwise."""
    if name not in _PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}: the known ones are {', '.join(REASONING_PARSERS)}")
    return ReasoningParser(name, opens_implicitly=_PARSERS[name])
