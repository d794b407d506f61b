"""pythonic calls streamed: the head (id, name) as soon as `name(` is read, then the arguments one keyword argument
at a time, as JSON pieces adding up to the non-streamed arguments; token by token, character by character and in
seeded random pieces, the stream reassembles to extract() of the whole output, malformed lists included."""

from __future__ import annotations

import json
import random
import re

import pytest

from jaxllm.tool_calling import ContentDelta, ToolCallDelta, get_tool_parser
from jaxllm.tool_calling.call_head import MORE, python_space
from jaxllm.tool_calling.pythonic import parse_calls
from tests.tool_calling.helpers import check_streams_as_extracted, random_pieces, without_ids
from tests.tool_calling.test_brackets import random_value
from tests.tool_calling.test_tool_parsers import PYTHONIC

OUTPUTS = [text for text, _, _ in PYTHONIC] + [
    '[get_weather(city="Paris", unit="c"), get_time(tz="UTC")]',
    "[book(hotel='Le \"Petit\" Coin, (Paris) [5*]', nights=3, guests=[{'name': 'Ann', 'age': 31}, "
    "{'name': \"O'Brien\", 'age': None}], flags=(True, False), note='a\\\\b \\'q\\' \\u00e9 \\n')]",
    "[f(s='''multi\nline, with ) and ]''', t=\"\"\"x\"\"\", u='', v=0x1F, w=1_000, x=-0.5, y=+2)]",
    "[calc(expr='(1, 2)', nested={'a': {'b': [[], {}, ()]}}), calc(expr=\"]\"), calc()]\nDone.",
    "Let me look that up: [search(q='x')]",
    "[search(q='x'), 42, other(a=1)]",
    "[search(q='x', limit=10, order=desc)]",
    "[search(q='x'), broken(a=1, b=[1, 2)]",
    "[f(a=1,\n    b=2,\n)]\n\n  ",
]
VALID = [text for text in OUTPUTS if get_tool_parser("pythonic").extract(text).content is None]
_TOKEN = re.compile(r" ?\w+| ?[^\w\s]+|\s+")


def tokens(text: str) -> list[str]:
    """`text` cut as a BPE tokenizer might cut it: words with their leading space, runs of punctuation, spaces."""
    pieces = _TOKEN.findall(text)
    assert "".join(pieces) == text
    return pieces


@pytest.mark.parametrize("text", OUTPUTS)
def test_streams_as_extracted_in_any_pieces(text):
    rng = random.Random(text)
    check_streams_as_extracted("pythonic", text, tokens(text))
    check_streams_as_extracted("pythonic", text, list(text))
    for _ in range(20):
        check_streams_as_extracted("pythonic", text, random_pieces(text, rng))


def test_the_recorded_outputs_are_mostly_calls():
    """The outputs above are the ones a model writes: well-formed ones give calls and no content."""
    assert len(VALID) >= 9


def argument_pieces(deltas: list) -> dict[int, list[str]]:
    """Each call's non-empty argument pieces, checking that its head (id, name) came before them."""
    pieces: dict[int, list[str]] = {}
    for delta in deltas:
        if isinstance(delta, ToolCallDelta):
            if delta.name is not None:
                assert delta.index not in pieces and delta.arguments == ""
                pieces[delta.index] = []
            elif delta.arguments:
                pieces[delta.index].append(delta.arguments)
    return pieces


@pytest.mark.parametrize("text", VALID)
@pytest.mark.parametrize("cut", [tokens, list])
def test_each_argument_is_a_piece_after_the_head(text, cut):
    deltas = check_streams_as_extracted("pythonic", text, cut(text))
    calls = get_tool_parser("pythonic").extract(text).tool_calls
    for index, pieces in argument_pieces(deltas).items():
        count = len(json.loads(calls[index].arguments))
        assert "".join(pieces) == calls[index].arguments
        assert max(count, 1) <= len(pieces) <= count + 1  # a piece an argument ("}" apart after a trailing ",")


def test_deltas_come_as_soon_as_their_text_is_read():
    stream = get_tool_parser("pythonic").stream()
    assert stream.feed("[get_weather") == []
    [head] = stream.feed("(")
    assert (head.index, head.name, head.arguments) == (0, "get_weather", "") and head.id.startswith("call_")
    assert stream.feed('city="Paris, (France)"') == []
    assert stream.feed(", ") == [ToolCallDelta(0, '{"city": "Paris, (France)"')]
    assert stream.feed("unit='c'") == []
    assert stream.feed("), get_") == [ToolCallDelta(0, ', "unit": "c"}')]
    [head] = stream.feed("time(")
    assert (head.index, head.name) == (1, "get_time")
    assert stream.feed("tz=None)") == [ToolCallDelta(1, '{"tz": null}')]
    assert stream.feed("]\n\nChecking.") == [ContentDelta("Checking.")]
    assert stream.finish() == [] and stream.num_tool_calls == 2


def test_a_call_that_breaks_keeps_what_was_read_and_the_rest_is_content():
    stream = get_tool_parser("pythonic").stream()
    head, first = stream.feed("[f(a=1, ")
    assert head.name == "f" and first == ToolCallDelta(0, '{"a": 1')
    assert stream.feed("b=x") == []
    assert stream.feed(")]") == [ToolCallDelta(0, "}"), ContentDelta("b=x)]")]
    assert stream.finish() == []


def test_a_list_not_opening_with_a_call_head_streams_nothing_until_it_closes():
    stream = get_tool_parser("pythonic").stream()
    assert stream.feed("[(f)(a=1") == []
    [head, arguments] = stream.feed(")]")
    assert (head.name, arguments.arguments) == ("f", '{"a": 1}')


def random_call_list(rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """A well-formed call list of random literal values, and its calls as the ast reading of the whole list gives
    them."""
    space = rng.choice(["", " ", "\n  "])
    calls = []
    for index in range(rng.randint(1, 3)):
        arguments = {f"arg_{i}": random_value(rng) for i in range(rng.randint(0, 4))}
        calls.append(f"fn_{index}(" + f",{space}".join(f"{k}={v!r}" for k, v in arguments.items()) + ")")
    text = "[" + space + f",{space}".join(calls) + space + "]"
    return text, [(call.name, call.arguments) for call in parse_calls(text)]


@pytest.mark.parametrize("seed", range(3))
def test_random_values_convert_as_the_whole_list_does(seed):
    """Streamed piece by piece, each value converts as the ast reading of the whole list converts it."""
    rng = random.Random(seed)
    for _ in range(100):
        text, calls = random_call_list(rng)
        assert without_ids(get_tool_parser("pythonic").extract(text)) == (None, calls), text
        check_streams_as_extracted("pythonic", text, random_pieces(text, rng))


def mutated(text: str, rng: random.Random) -> str:
    """`text` with a character or two deleted or inserted, or cut short: how a model breaks a call list."""
    for _ in range(rng.randint(1, 2)):
        at, op = rng.randrange(len(text) + 1), rng.random()
        if op < 0.4:
            text = text[:at] + text[at + 1:]
        elif op < 0.8:
            text = text[:at] + rng.choice("()[]{},='\"\\ \nx1") + text[at:]
        else:
            text = text[:at]
    return text


def test_broken_lists_stream_as_extracted_and_well_formed_ones_read_as_the_ast_does():
    rng = random.Random("broken")
    for _ in range(300):
        text = mutated(rng.choice(OUTPUTS) if rng.random() < 0.3 else random_call_list(rng)[0], rng)
        check_streams_as_extracted("pythonic", text, random_pieces(text, rng))
        whole = parse_calls(text.strip()) if text.strip().startswith("[") else None
        if whole is not None:
            expected = (None, [(call.name, call.arguments) for call in whole])
            assert without_ids(get_tool_parser("pythonic").extract(text)) == expected, text


@pytest.mark.parametrize("value", ["-" * 100_000 + "1", "not " * 100_000 + "x"])
def test_a_list_nested_too_deep_for_the_parser_is_content(value):
    """ast.parse raises MemoryError for nesting this deep: the list is no calls, never an error."""
    text = f"[1, f(a={value})]"
    assert parse_calls(text) is None
    assert get_tool_parser("pythonic").extract(text).content == text
    check_streams_as_extracted("pythonic", text, [text])


def test_python_space_waits_for_a_comment_s_line_to_end():
    """Between a pythonic list's items, comments and backslash-newlines are space (as Python reads them); a text
    that ends inside a comment, or just after a backslash, says nothing yet unless it is final."""
    assert python_space("  # x ]\n  b", 0, False) == 10
    assert python_space("  # x ]", 0, False) == MORE
    assert python_space("  # x ]", 0, True) == 7
    assert python_space(" \\\n b", 0, False) == 4
    assert python_space(" \\", 0, False) == MORE
    assert python_space(" \\", 0, True) == 1
    assert python_space(" \\x", 0, False) == 1
