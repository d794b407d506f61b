"""Shared by the tool-calling tests: a text fed to a stream in random pieces, and results compared without ids."""

from __future__ import annotations

import random

from jaxllm.tool_calling import ContentDelta, ToolCallDelta, assemble_tool_deltas, get_tool_parser


def random_pieces(text: str, rng: random.Random) -> list[str]:
    """`text` cut at random points: sometimes every character apart, sometimes few long pieces, sometimes empty
    pieces between (a token that brings no text)."""
    if not text:
        return [""] * rng.randint(0, 2)
    style = rng.choice(["chars", "small", "large"])
    if style == "chars":
        cuts = list(range(1, len(text)))
    else:
        count = rng.randint(1, max(1, len(text) // (3 if style == "small" else 15)))
        cuts = sorted(rng.sample(range(1, len(text)), min(count, len(text) - 1))) if len(text) > 1 else []
    bounds = [0] + cuts + [len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    for _ in range(rng.randint(0, 2)):
        pieces.insert(rng.randint(0, len(pieces)), "")
    return pieces


def without_ids(extracted) -> tuple:
    """(content, [(name, arguments), ...]): an extraction as comparable, ids left out."""
    return extracted.content, [(call.name, call.arguments) for call in extracted.tool_calls]


def check_delta_shapes(deltas: list) -> None:
    """No empty content delta; each call's first delta carries its id and name and no arguments, the next ones
    neither id nor name; indexes count up from 0."""
    seen: list[int] = []
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            assert delta.text
            continue
        assert isinstance(delta, ToolCallDelta)
        if delta.index not in seen:
            assert delta.index == len(seen) and delta.id and delta.name and delta.arguments == ""
            seen.append(delta.index)
        else:
            assert delta.id is None and delta.name is None and delta.index == seen[-1]


def streamed(stream, pieces: list[str]) -> list:
    """The deltas of a stream fed `pieces`, then finished."""
    deltas = []
    for piece in pieces:
        deltas += stream.feed(piece)
    return deltas + stream.finish()


def check_streams_as_extracted(parser_name: str, text: str, pieces: list[str]) -> list:
    """`text` streamed in `pieces` reassembles to the parser's extract() of the whole (ids aside), in well-shaped
    deltas; the deltas."""
    parser = get_tool_parser(parser_name)
    deltas = streamed(parser.stream(), pieces)
    check_delta_shapes(deltas)
    assert without_ids(assemble_tool_deltas(deltas)) == without_ids(parser.extract(text)), (text, pieces)
    return deltas
