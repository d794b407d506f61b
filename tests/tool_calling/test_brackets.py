"""JsonEnd, PythonEnd and PythonItemEnd against the parsers they stand in for: on random nested values followed by
more text, fed in random pieces, the end found is where json's raw_decode / the Python literal ends."""

from __future__ import annotations

import json
import random

import pytest

from jaxllm.tool_calling.brackets import JsonEnd, PythonEnd, PythonItemEnd
from tests.tool_calling.helpers import random_pieces

STRINGS = ["", "a", "}", "]", ")", "{[(", '"', "'", "\\", "\\'", "'''", '"""', "é🎉", "\n", "x'y\"z", "\\\\\""]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["str", "num", "const"] + (["list", "dict", "tuple"] if depth < 4 else []))
    if kind == "str":
        return rng.choice(STRINGS) + rng.choice(STRINGS)
    if kind == "num":
        return rng.choice([0, -1, 2.5, 10 ** 20])
    if kind == "const":
        return rng.choice([None, True, False])
    items = [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict":
        return {rng.choice(STRINGS) + str(i): item for i, item in enumerate(items)}
    return tuple(items) if kind == "tuple" else items


def find_in_pieces(finder, text: str, rng: random.Random, final_arg: bool) -> int | None:
    seen = ""
    for piece in random_pieces(text, rng):
        seen += piece
        end = finder.find(seen, False) if final_arg else finder.find(seen)
        if end is not None:
            return end
    return finder.find(seen, True) if final_arg else None


@pytest.mark.parametrize("seed", range(3))
def test_json_end(seed):
    rng = random.Random(seed)
    for _ in range(300):
        value = random_value(rng)
        value = value if isinstance(value, dict) else [value]
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5) + rng.choice(["", " tail", "}]", '"'])
        expected = json.JSONDecoder().raw_decode(text)[1]
        assert find_in_pieces(JsonEnd(), text, rng, final_arg=False) == expected, text


@pytest.mark.parametrize("seed", range(3))
def test_python_end(seed):
    rng = random.Random(seed)
    for _ in range(300):
        literal = repr([random_value(rng)])
        if rng.random() < 0.3:  # the same strings triple-quoted where that is possible
            literal = literal.replace("'a'", "'''a'''").replace('"a"', '"""a"""')
        text = literal + rng.choice(["", " tail", ")]", "'"])
        assert eval(literal) is not None  # the literal is valid Python
        assert find_in_pieces(PythonEnd(), text, rng, final_arg=True) == len(literal), text


def with_comments(literal: str, rng: random.Random) -> str:
    """literal with `# ...` comments (holding brackets and quotes) after some of its commas and opening brackets
    outside its strings, each to the end of its line: the same value to Python."""
    out, quote, at = [], "", 0
    while at < len(literal):
        char = literal[at]
        out.append(char)
        if quote:
            if char == "\\":
                out.append(literal[at + 1])
                at += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in ",[({" and rng.random() < 0.5:
            comment = rng.choice(STRINGS).replace("\n", "") + rng.choice(["]", ")", "'", '"', "#", ""])
            out.append("  # " + comment + "\n")
        at += 1
    return "".join(out)


@pytest.mark.parametrize("seed", range(3))
def test_python_end_skips_comments(seed):
    rng = random.Random(seed)
    for _ in range(300):
        literal = with_comments(repr([random_value(rng)]), rng)
        text = literal + rng.choice(["", " tail", ")]", "'", "  # ]"])
        assert eval(literal) is not None  # the commented literal is valid Python
        assert find_in_pieces(PythonEnd(), text, rng, final_arg=True) == len(literal), text


@pytest.mark.parametrize("seed", range(3))
def test_python_item_end(seed):
    """An item (a value standing in a call's arguments) ends just past the "," or ")" that follows it."""
    rng = random.Random(seed)
    for _ in range(300):
        literal = repr(random_value(rng))
        text = literal + rng.choice([",", ", b='x')", ")", ")]", " ,'"])
        expected = text.index(",", len(literal)) if "," in text[len(literal):] else text.index(")", len(literal))
        assert find_in_pieces(PythonItemEnd(), text, rng, final_arg=True) == expected + 1, text


def test_item_ends_at_a_closing_bracket_of_any_kind():
    assert PythonItemEnd().find("[1, 2]]", True) == 7
    assert PythonItemEnd().find("'a,)', 3", True) == 6
    assert PythonItemEnd().find("(1, 2", True) is None


def test_comments_end_at_their_line():
    assert PythonEnd().find("[f(a=1)  # ] it's\n]", True) == 19
    assert PythonEnd().find("[f(a='#]')]", True) == 11  # in a string, # is text
    assert PythonEnd().find("[f(a=1)  # ]", False) is None  # the comment's line has not ended
    assert PythonItemEnd().find("1  # (a, b)\n, c=2)", True) == 13


def test_ends_that_never_come():
    assert JsonEnd().find('{"a": "}') is None
    assert PythonEnd().find("[f(a='''x]''')", True) is None
    assert PythonEnd().find("[f(a='x\\", True) is None
    assert PythonEnd().find("[f(a=1)  # ]", True) is None
