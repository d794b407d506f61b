"""The reasoning parsers on whole outputs: deepseek_r1 (the opening tag optional), qwen3 (reasoning only after an
opening <think>), thinking disabled; the stream holding back what may be a tag; the registry."""

from __future__ import annotations

import pytest

from jaxllm.tool_calling import (REASONING_PARSERS, ContentDelta, ReasoningDelta, ReasoningSplit,
                                 get_reasoning_parser)

# (parser, output, enable_thinking, (reasoning_content, content))
CASES = [
    # deepseek_r1: the template opened <think> in the prompt
    ("deepseek_r1", "Let me think.\n2 + 2 = 4.\n</think>\n\nThe answer is 4.", True,
     ("Let me think.\n2 + 2 = 4.", "The answer is 4.")),
    ("deepseek_r1", "<think>\nLet me think.\n</think>\n\nThe answer is 4.", True,
     ("Let me think.", "The answer is 4.")),
    ("deepseek_r1", "  <think>Hmm, 日本語 🎉</think>Ok", True, ("Hmm, 日本語 🎉", "Ok")),
    ("deepseek_r1", "Still thinking about it...", True, ("Still thinking about it...", None)),
    ("deepseek_r1", "<think>\n\n</think>\n\nHi!", True, (None, "Hi!")),
    ("deepseek_r1", "Done.</think>", True, ("Done.", None)),
    ("deepseek_r1", "a</think>b</think><think>c", True, ("a", "b</think><think>c")),
    ("deepseek_r1", "x <think> y</think>z", True, ("x <think> y", "z")),
    ("deepseek_r1", "Hi!\n</think>", False, (None, "Hi!\n</think>")),
    ("deepseek_r1", "", True, (None, None)),
    # qwen3: the model opens <think> itself, or does not think
    ("qwen3", "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?", True,
     ("The user greets me.", "Hello! How can I help?")),
    ("qwen3", "\n<think>ok</think>Hi", True, ("ok", "Hi")),
    ("qwen3", "Hello! How can I help?", True, (None, "Hello! How can I help?")),
    ("qwen3", "\n\nHello </think> there", True, (None, "\n\nHello </think> there")),
    ("qwen3", "I write <think> tags.", True, (None, "I write <think> tags.")),
    ("qwen3", "<think>\nCut short by max_tokens", True, ("Cut short by max_tokens", None)),
    ("qwen3", "<think>x</think>y", False, (None, "<think>x</think>y")),
    ("qwen3", "<thi", True, (None, "<thi")),
    ("qwen3", "", True, (None, None)),
]


@pytest.mark.parametrize("name,text,enable_thinking,expected", CASES)
def test_extract(name, text, enable_thinking, expected):
    split = get_reasoning_parser(name).extract(text, enable_thinking=enable_thinking)
    assert split == ReasoningSplit(*expected)
    reasoning, content = split  # a pair
    assert (reasoning, content) == expected


def test_stream_holds_back_what_may_be_a_tag():
    stream = get_reasoning_parser("qwen3").stream()
    assert stream.feed("\n<thi") == []
    assert stream.feed("nk>\nI should") == [ReasoningDelta("I should")]
    assert stream.feed(" greet.\n</th") == [ReasoningDelta(" greet.")]
    assert not stream.reasoning_ended
    assert stream.feed("ink>\n\n") == [] and stream.reasoning_ended
    assert stream.feed("Hello") == [ContentDelta("Hello")]
    assert stream.finish() == []
    stream = get_reasoning_parser("qwen3").stream()
    assert stream.feed("Hel") == [ContentDelta("Hel")] and stream.reasoning_ended
    stream = get_reasoning_parser("deepseek_r1").stream(enable_thinking=False)
    assert stream.feed("<think>") == [ContentDelta("<think>")]


def test_registry():
    assert REASONING_PARSERS == ("deepseek_r1", "qwen3")
    with pytest.raises(ValueError, match=r"unknown reasoning parser 'r1': the known ones are deepseek_r1, qwen3"):
        get_reasoning_parser("r1")
