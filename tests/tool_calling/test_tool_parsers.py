"""Each tool-call parser on outputs as its models write them: several calls, text around them, malformed calls left
as text, unicode and nested JSON arguments; calls whose head was read streaming their arguments as written (broken
arguments included: the call had begun); the registry."""

from __future__ import annotations

import json
import re

import pytest

from jaxllm.tool_calling import TOOL_PARSERS, ToolCallDelta, get_tool_parser
from tests.tool_calling.helpers import without_ids

WEATHER = {"location": "Paris, France", "unit": "celsius"}
NESTED = {"to": "José Ñúñez", "body": "日本語のテキスト 🎉 with \"quotes\", a back\\slash and <b>tags</b>",
          "meta": {"tags": ["a", {"b": [1, 2.5, None, True, False]}], "empty": {}, "list": []}}


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def extract(parser: str, text: str):
    return without_ids(get_tool_parser(parser).extract(text))


# (output, content, [(name, arguments)])
HERMES = [
    ("I'll check the weather for you.\n<tool_call>\n" + dumps({"name": "get_weather", "arguments": WEATHER})
     + "\n</tool_call>", "I'll check the weather for you.", [("get_weather", dumps(WEATHER))]),
    ("<tool_call>\n" + dumps({"name": "get_weather", "arguments": WEATHER}) + "\n</tool_call>\n<tool_call>\n"
     + dumps({"name": "send_mail", "arguments": NESTED}) + "\n</tool_call>",
     None, [("get_weather", dumps(WEATHER)), ("send_mail", dumps(NESTED))]),
    # Hermes 2 Pro writes the arguments first
    ('<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}\n</tool_call>',
     None, [("get_stock_fundamentals", '{"symbol": "TSLA"}')]),
    # compact JSON: the arguments as written (streamed); the arguments given as JSON text; no arguments (read
    # whole: written back as JSON)
    ('<tool_call>{"name":"f","arguments":{"a":[1,{"b":null}]}}</tool_call>', None, [("f", '{"a":[1,{"b":null}]}')]),
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', None, [("f", '{"a": 1}')]),
    ('<tool_call>{"name": "now"}</tool_call>', None, [("now", "{}")]),
    # text after the calls; the last call without its closing tag (the output stopped there)
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n\nDone.', "Done.", [("f", "{}")]),
    ('Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": "é"}}\n', "Sure.", [("f", '{"x": "é"}')]),
    # calls whose head is malformed are content, tags and all; a well-formed one beside them is still a call
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"arguments": {}}</tool_call>',
     '<tool_call>{"arguments": {}}</tool_call>', [("f", "{}")]),
    ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', '<tool_call>{"name": "f", "arguments": [1, 2]}'
     '</tool_call>', []),
    ('<tool_call>{"name": "f" "arguments": {}}</tool_call>', '<tool_call>{"name": "f" "arguments": {}}</tool_call>',
     []),
    ('Checking.\n<tool_call>\n{"name": "f", "argu', 'Checking.\n<tool_call>\n{"name": "f", "argu', []),
    # a streamed call had begun: broken or cut arguments stay its arguments, as written; extra text is content
    ('<tool_call>\n{"name": "get_weather", "arguments": {"location": }\n</tool_call>', None,
     [("get_weather", '{"location": }')]),
    ('<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>', None, [("f", '{"a": NaN}')]),
    ('<tool_call>{"name": "f", "arguments": {"a": 1}, "id": 7}</tool_call>ok', ', "id": 7}ok',
     [("f", '{"a": 1}')]),
    ('<tool_call>{"name": "f", "arguments": {"a": "x', None, [("f", '{"a": "x')]),
    # no call: the text as it is, whitespace and all
    ("The capital of France is Paris.\n\n", "The capital of France is Paris.\n\n", []),
    ("  a <tool_ b", "  a <tool_ b", []),
    ("", None, []),
]

LLAMA3_JSON = [
    (dumps({"name": "get_weather", "parameters": WEATHER}), None, [("get_weather", dumps(WEATHER))]),
    ("<|python_tag|>" + dumps({"name": "get_weather", "parameters": WEATHER}) + "; "
     + dumps({"name": "send_mail", "parameters": NESTED}), None,
     [("get_weather", dumps(WEATHER)), ("send_mail", dumps(NESTED))]),
    ('\n\n{"name": "f", "arguments": {"a": 1}};{"name": "g", "parameters": {}}', None,
     [("f", '{"a": 1}'), ("g", "{}")]),
    ('Let me look that up.<|python_tag|>{"name": "search", "parameters": {"q": "jax"}}', "Let me look that up.",
     [("search", '{"q": "jax"}')]),
    ('{"name": "f", "parameters": {"a": "}{"}}\n\nThat is the call.', "That is the call.", [("f", '{"a": "}{"}')]),
    # JSON that is no call is content: no name, no parameters, both keys, arguments that are no object
    ('{"answer": 4}', '{"answer": 4}', []),
    ('{"name": "Ada Lovelace", "born": 1815}', '{"name": "Ada Lovelace", "born": 1815}', []),
    ('{"arguments": {}, "parameters": {}, "name": "f"}', '{"arguments": {}, "parameters": {}, "name": "f"}', []),
    ('{"name": "f", "parameters": "x"}', '{"name": "f", "parameters": "x"}', []),
    # a streamed call had begun: what follows its arguments other than "}" is content
    ('{"name": "f", "parameters": {}, "arguments": {}}', ', "arguments": {}}', [("f", "{}")]),
    # a malformed call after a good one; a ";" that no call follows
    ('{"name": "f", "parameters": {}}; {"name": 1, "parameters": {}}', '; {"name": 1, "parameters": {}}',
     [("f", "{}")]),
    ('{"name": "f", "parameters": {}}; and that is all', "; and that is all", [("f", "{}")]),
    # code interpreter calls and unfinished objects are content; plain text
    ("<|python_tag|>print(sum(range(10)))", "<|python_tag|>print(sum(range(10)))", []),
    ('{"name": "f", "parameters": {"a": 1}', None, [("f", '{"a": 1}')]),  # cut after its arguments
    ('{"parameters": {"a": 1}, "name": "f"', '{"parameters": {"a": 1}, "name": "f"', []),  # read whole: unfinished
    ("The answer is {x}.", "The answer is {x}.", []),
    ("   ", "   ", []),
]

MISTRAL = [
    # before v11: one array
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + dumps(WEATHER) + '}, {"name": "send_mail", '
     '"arguments": ' + dumps(NESTED) + '}]', None, [("get_weather", dumps(WEATHER)), ("send_mail", dumps(NESTED))]),
    ('Sure.[TOOL_CALLS][{"name": "f", "arguments": {}}]', "Sure.", [("f", "{}")]),
    # v11: name then arguments; v13: [ARGS] between
    ('[TOOL_CALLS]get_weather{"location": "Paris, France", "unit": "celsius"}[TOOL_CALLS]send_mail'
     + dumps(NESTED), None, [("get_weather", dumps(WEATHER)), ("send_mail", dumps(NESTED))]),
    ('Let me check.[TOOL_CALLS]get_weather[ARGS]{"location": "Paris, France", "unit": "celsius"}[TOOL_CALLS]'
     'get-time_2[ARGS]{}', "Let me check.", [("get_weather", dumps(WEATHER)), ("get-time_2", "{}")]),
    ('[TOOL_CALLS]f[ARGS]{"a": {"b": ["}", "]"]}}</s>', "</s>", [("f", '{"a": {"b": ["}", "]"]}}')]),
    # a named call had begun at its arguments' "{": broken or cut, they stay its arguments
    ('[TOOL_CALLS]f[ARGS]{"a": }', None, [("f", '{"a": }')]),
    # malformed: content from the marker
    ('[TOOL_CALLS] no call here', "[TOOL_CALLS] no call here", []),
    ('[TOOL_CALLS] [{"name": "f"}, 3]', '[TOOL_CALLS] [{"name": "f"}, 3]', []),
    ('[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS][1]', '[TOOL_CALLS]g[ARGS][1]', [("f", '{"a": 1}')]),
    ('[TOOL_CALLS]f[ARGS]{"a": 1', None, [("f", '{"a": 1')]),
    ('[TOOL_CALLS] [{"name": "f", "arguments": {}}', '[TOOL_CALLS] [{"name": "f", "arguments": {}}', []),
    ("Just an answer.", "Just an answer.", []),
]

PYTHONIC = [
    ('[get_weather(location="Paris, France", unit="celsius"), get_time(tz=\'Europe/Paris\')]', None,
     [("get_weather", dumps(WEATHER)), ("get_time", '{"tz": "Europe/Paris"}')]),
    ("[send_mail(to='José Ñúñez', body='日本語 🎉 \"quoted\"', meta={'tags': ['a', {'b': (1, 2.5, None, True)}], "
     "'n': -3})]", None, [("send_mail", dumps({"to": "José Ñúñez", "body": '日本語 🎉 "quoted"',
                                              "meta": {"tags": ["a", {"b": [1, 2.5, None, True]}], "n": -3}}))]),
    ("[write(text='''two\nlines with ] and ' inside''', path=\"a)b\")]", None,
     [("write", dumps({"text": "two\nlines with ] and ' inside", "path": "a)b"}))]),
    ("  [now()]\n\nCalling it now.", "Calling it now.", [("now", "{}")]),
    ("[search(q='x', tags=['a',  # the user's ] tag (\n    'b'])]", None,
     [("search", '{"q": "x", "tags": ["a", "b"]}')]),
    ("[get_weather(city='Paris'),  # the user's city ] (\n  get_time(  # now \"\n    tz='UTC',  # ) zone\n  ),"
     "  # trailing ]\n]", None, [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "UTC"}')]),
    ("[f(a=1, \\\n  b=2), \\\ng()]", None, [("f", '{"a": 1, "b": 2}'), ("g", "{}")]),
    ("[\n  search(q='a, b (c) [d] {e}', n=-2.5e3),\n  log(msg=\"say \\\"hi\\\" it's\", extra=None,),\n]", None,
     [("search", '{"q": "a, b (c) [d] {e}", "n": -2500.0}'), ("log", dumps({"msg": 'say "hi" it\'s', "extra": None}))]),
    ("[f(a='x\\'y\\\\', b=r'\\d+', c=(1, [2, {'k': ('v',)}]), d=\"é\" 'à', e=False)]", None,
     [("f", dumps({"a": "x'y\\", "b": "\\d+", "c": [1, [2, {"k": ["v"]}]], "d": "éà", "e": False}))]),
    ("[  ping ( ) , pong(x=1) ]", None, [("ping", "{}"), ("pong", '{"x": 1}')]),
    ("[(f)(a=1)]", None, [("f", '{"a": 1}')]),  # not in the streamed form: read whole
    # not calls: content
    ("[1, 2, 3]", "[1, 2, 3]", []),
    ("[os.system(cmd='ls')]", "[os.system(cmd='ls')]", []),
    ("[]", "[]", []),
    ("Sure: [f(a=1)]", "Sure: [f(a=1)]", []),
    ("[1] Smith et al.", "[1] Smith et al.", []),
    ("[True(a=1)]", "[True(a=1)]", []),
    # a call whose head `[f(` was read is a call (its head was streamed): from where the text stops being well
    # formed, its arguments are closed and the rest is content
    ("[f(1)]", "1)]", [("f", "{}")]),
    ("[f(a=b)]", "a=b)]", [("f", "{}")]),
    ("[f(a=1, b={1, 2})]", "b={1, 2})]", [("f", '{"a": 1}')]),
    ("[f(a=1, **kw)]", "**kw)]", [("f", '{"a": 1}')]),
    ("[f(a=1, a=2)]", "a=2)]", [("f", '{"a": 1}')]),
    ("[f(a=1e999, b=1j, c=b'x')]", "a=1e999, b=1j, c=b'x')]", [("f", "{}")]),
    ("[f(a=1), 2]", ", 2]", [("f", '{"a": 1}')]),
    ("[f(a=1) g(b=2)]", "g(b=2)]", [("f", '{"a": 1}')]),
    ("[f(a=1], g(b=2)]", "a=1], g(b=2)]", [("f", "{}")]),
    ("[f(a=1, b='x", "b='x", [("f", '{"a": 1}')]),  # the output ended inside the call
    ("[f(a=1", "a=1", [("f", "{}")]),
    ("[f(a=1)", None, [("f", '{"a": 1}')]),
]

CASES = [("hermes", *case) for case in HERMES] + [("llama3_json", *case) for case in LLAMA3_JSON] \
    + [("mistral", *case) for case in MISTRAL] + [("pythonic", *case) for case in PYTHONIC]


BROKEN = {'{"location": }', '{"a": NaN}', '{"a": "x', '{"a": }', '{"a": 1'}  # arguments a model broke or cut


@pytest.mark.parametrize("parser,text,content,calls", CASES)
def test_extract(parser, text, content, calls):
    assert extract(parser, text) == (content, calls)
    for _, arguments in calls:
        if arguments not in BROKEN:
            assert isinstance(json.loads(arguments), dict)


def test_ids_are_fresh_and_shaped_as_the_format_wants():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "f", "arguments": {}}</tool_call>'
    calls = get_tool_parser("hermes").extract(text).tool_calls + get_tool_parser("hermes").extract(text).tool_calls
    assert len({call.id for call in calls}) == 4
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id) for call in calls)
    # Mistral's chat templates take 9 letters and digits back
    mistral = get_tool_parser("mistral").extract('[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{}').tool_calls
    assert len(mistral) == 2 and all(re.fullmatch(r"[A-Za-z0-9]{9}", call.id) for call in mistral)
    assert calls[0].to_openai() == {"id": calls[0].id, "type": "function",
                                    "function": {"name": "f", "arguments": "{}"}}


def test_stream_holds_back_what_may_be_a_marker_and_streams_the_arguments():
    stream = get_tool_parser("hermes").stream()
    assert [d.text for d in stream.feed("Let me check <tool")] == ["Let me check"]
    assert stream.feed("_call>\n{\"name\": \"get_weather\", ") == []
    head, arguments = stream.feed('"arguments": {"city": ')
    assert (head.index, head.name, head.arguments) == (0, "get_weather", "") and head.id.startswith("call_")
    assert (arguments.index, arguments.id, arguments.arguments) == (0, None, '{"city": ')
    assert head.to_openai() == {"index": 0, "id": head.id, "type": "function",
                                "function": {"name": "get_weather", "arguments": ""}}
    assert arguments.to_openai() == {"index": 0, "function": {"arguments": '{"city": '}}
    assert stream.feed('"Pa') == [ToolCallDelta(0, '"Pa')]
    assert stream.feed('ris"}}\n</tool_') == [ToolCallDelta(0, 'ris"}')]
    assert stream.feed("call>") == [] and stream.num_tool_calls == 1
    assert stream.feed("\n") == [] and stream.finish() == []
    with pytest.raises(RuntimeError):
        stream.feed("x")


@pytest.mark.parametrize("parser,text", [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"q": "a b c d"}}\n</tool_call>'),
    ("llama3_json", '{"name": "f", "parameters": {"q": "a b c d"}}'),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"q": "a b c d"}')])
def test_each_streaming_format_hands_out_the_arguments_as_they_arrive(parser, text):
    """Token by token (pieces of 2 characters), the arguments come in many deltas, each as soon as it arrived."""
    stream, arrived = get_tool_parser(parser).stream(), []
    for at in range(0, len(text), 2):
        arrived.append([d.arguments for d in stream.feed(text[at:at + 2]) if isinstance(d, ToolCallDelta)])
    arguments = [piece for pieces in arrived for piece in pieces if piece]
    assert "".join(arguments) == '{"q": "a b c d"}' and len(arguments) >= 7
    assert sum(bool(pieces) for pieces in arrived) >= 8  # pieces came in most feeds, not at the end


def test_content_streams_without_delay_when_no_marker_can_follow():
    stream = get_tool_parser("pythonic").stream()
    assert [d.text for d in stream.feed("Hello")] == ["Hello"]
    assert [d.text for d in stream.feed(" wor")] == [" wor"]
    stream = get_tool_parser("mistral").stream()
    assert [d.text for d in stream.feed("Hello [TOOL")] == ["Hello"]
    assert [d.text for d in stream.feed(" yes")] == [" [TOOL yes"]
    assert not any(isinstance(d, ToolCallDelta) for d in stream.finish())


def test_registry():
    assert set(TOOL_PARSERS) >= {"hermes", "llama3_json", "mistral", "pythonic"}
    assert get_tool_parser("llama4_json").extract('{"name": "f", "parameters": {}}').tool_calls[0].name == "f"
    with pytest.raises(ValueError, match=r"unknown tool call parser 'hermes2'.*hermes, llama3_json.*pythonic"):
        get_tool_parser("hermes2")


def test_a_mistral_array_nested_too_deep_for_the_json_decoder_is_content():
    """json.loads raises RecursionError for nesting this deep: the array is no calls, never an error (hermes and
    llama3_json hand such arguments on as their text, unparsed)."""
    text = '[TOOL_CALLS][{"name": "f", "arguments": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}]"
    result = get_tool_parser("mistral").extract(text)
    assert not result.tool_calls and result.content == text
