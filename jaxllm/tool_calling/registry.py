"""The tool-call parsers by vLLM's names (--tool-call-parser)."""

from __future__ import annotations

from jaxllm.tool_calling.hermes import HermesToolParser
from jaxllm.tool_calling.llama3_json import Llama3JsonToolParser
from jaxllm.tool_calling.mistral import MistralToolParser
from jaxllm.tool_calling.pythonic import PythonicToolParser
from jaxllm.tool_calling.stream import ToolParser

_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,  # vLLM's second name for the same format
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
}
TOOL_PARSERS = tuple(sorted(_PARSERS))


def get_tool_parser(name: str) -> ToolParser:
    """The parser called `name`; ValueError naming the known ones otherwise."""
    if name not in _PARSERS:
        raise ValueError(f"unknown tool call parser {name!r}: the known ones are {', '.join(TOOL_PARSERS)}")
    return _PARSERS[name]()
