"""The stream property: a stream's deltas, reassembled, are what extract() gives for the whole text, for any
split of the text into pieces (seeded random splits, pieces of one character and empty ones included, so that
markers, escapes and quotes are cut everywhere), on recorded-style outputs and on random texts built of each
format's markers and fragments of calls."""

from __future__ import annotations

import random

import pytest

from jaxllm.tool_calling import REASONING_PARSERS, TOOL_PARSERS, assemble_reasoning_deltas, get_reasoning_parser
from tests.tool_calling.helpers import check_streams_as_extracted, random_pieces, streamed
from tests.tool_calling.test_reasoning import CASES as REASONING_CASES
from tests.tool_calling.test_tool_parsers import CASES as TOOL_CASES

COMMON = [" ", "  ", "\n", "\n\n", "text", "é", "🎉", "日本", "\\", '"', "'", "{", "}", "[", "]", "(", ")", ";", ",",
          ":", "=", "<", ">", "|", '{"name": "f", "arguments": {"a": "x]"}}', '{"name": "g", "parameters": {}}',
          '{"a": [1, "}"]}', '"\\""', "null"]
FRAGMENTS = {
    "hermes": ["<tool_call>", "</tool_call>", "<tool_", "</tool", '{"name": "f", "arguments": {"é": "🎉\\n"}}',
               '{"arguments": {}, "name": "h"}', '{"name": "f"', "}}", '<tool_call>\n{"name": "f", "arguments": {}}\n',
               '<tool_call>{"name": "g", "arguments": {"b": "<"}}</tool_call>'],
    "llama3_json": ["<|python_tag|>", "<|python", '{"name": "f", "parameters": {"x": [1, {}]}}', "; ", ";",
                    '{"name": "f", "arguments": "{\\"a\\": 1}"}', '{"name": 3, "parameters": {}}'],
    "mistral": ["[TOOL_CALLS]", "[TOOL_", "[ARGS]", "[AR", "add", "get-time_2", '[{"name": "f", "arguments": {}}]',
                '{"a": {"b": "]"}}', "[TOOL_CALLS]f[ARGS]", "[TOOL_CALLS] [", "}]", '[TOOL_CALLS]g{"b": []}',
                '[TOOL_CALLS]f[ARGS]{"a": "[TOOL_CALLS]"}'],
    "pythonic": ["[f(a=1)]", "[f(a='x'), g(b=\"]\")]", "f(", "g(b=[1, (2, 3)])", "a=", "'''", '"""', "'''x]'''",
                 "None", "True", "{'k': -1.5}", "[", "), ", "[f(", ", g(", "b=2, ", "c='a, b)', ", '"\\""', "d=(1,)",
                 "x=", "**kw", "1j", "f(a=1, b=2)", ",)", ", ]", "=="],
}
FRAGMENTS["llama4_json"] = FRAGMENTS["llama3_json"]
REASONING_FRAGMENTS = ["<think>", "</think>", "<thi", "</th", " ", "\n", "\n\n", "thought", "answer", "é🎉", "<", "/",
                       ">", "think"]


def random_text(rng: random.Random, fragments: list[str], *more: list[str]) -> str:
    """Up to 14 fragments, half of them from the format's own (`more`) when given."""
    lists = [fragments, *more]
    return "".join(rng.choice(rng.choice(lists)) for _ in range(rng.randint(0, 14)))


def check_tool_stream(parser_name: str, text: str, rng: random.Random) -> None:
    for _ in range(3):
        check_streams_as_extracted(parser_name, text, random_pieces(text, rng))


@pytest.mark.parametrize("seed", range(4))
def test_recorded_outputs_stream_as_extracted(seed):
    rng = random.Random(seed)
    for parser, text, _, _ in TOOL_CASES:
        check_tool_stream(parser, text, rng)


@pytest.mark.parametrize("parser", TOOL_PARSERS)
def test_random_texts_stream_as_extracted(parser):
    rng = random.Random(f"tools {parser}")
    for _ in range(300):
        check_tool_stream(parser, random_text(rng, COMMON, FRAGMENTS[parser]), rng)


def check_reasoning_stream(name: str, text: str, enable_thinking: bool, rng: random.Random) -> None:
    parser = get_reasoning_parser(name)
    whole = parser.extract(text, enable_thinking=enable_thinking)
    for _ in range(3):
        pieces = random_pieces(text, rng)
        deltas = streamed(parser.stream(enable_thinking=enable_thinking), pieces)
        assert all(d.text for d in deltas)
        assert assemble_reasoning_deltas(deltas) == whole, (text, pieces)


@pytest.mark.parametrize("seed", range(4))
def test_recorded_reasoning_streams_as_extracted(seed):
    rng = random.Random(seed)
    for name, text, enable_thinking, _ in REASONING_CASES:
        check_reasoning_stream(name, text, enable_thinking, rng)


@pytest.mark.parametrize("name", REASONING_PARSERS)
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_random_reasoning_streams_as_extracted(name, enable_thinking):
    rng = random.Random(f"reasoning {name} {enable_thinking}")
    for _ in range(300):
        check_reasoning_stream(name, random_text(rng, REASONING_FRAGMENTS), enable_thinking, rng)
