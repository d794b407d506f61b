"""Tool calling and reasoning output: what a chat model's text holds besides its answer (OpenAI's tool_calls and
reasoning_content), read the way vLLM's --tool-call-parser and --reasoning-parser read it. Pure text in, plain
values out: no model, no tokenizer.

    calls.py        ToolCall, ExtractedToolCalls (content, tool_calls), call ids
    deltas.py       ContentDelta, ReasoningDelta, ToolCallDelta (OpenAI's streaming shapes), reassembly
    stream.py       ToolParser (extract(text), stream()) and ToolCallStream (feed(delta_text), finish()), driving a
                    format's Scanner
    hermes.py       <tool_call>{"name": ..., "arguments": {...}}</tool_call>          hermes
    llama3_json.py  [<|python_tag|>]{"name": ..., "parameters": {...}}; {...}           llama3_json, llama4_json
    mistral.py      [TOOL_CALLS][{...}] / [TOOL_CALLS]name{...} / name[ARGS]{...}     mistral
    pythonic.py     [f(a=1), g(b="x")]                                                  pythonic
    registry.py     get_tool_parser(name)
    reasoning.py    <think>...</think>: deepseek_r1, qwen3; get_reasoning_parser(name)
    tools.py        validate_tools(tools), validate_tool_choice(tool_choice, tools)
    forced.py       tool_choice "required" / named: the output's JSON schema, and its calls (streamed too)
    call_head.py    a call's head matched as it arrives; its arguments handed out in pieces
    markers.py, whitespace.py, brackets.py: reading text that arrives in pieces

Streams and extract() agree: a stream's deltas, reassembled, give the extract() of the whole text, however the
text was split into pieces. A call streams once its head (marker, name, the arguments' opening) is read: its
arguments then come in pieces as written; a call in another form is handed out once complete and well formed
(malformed, it is content).
"""

from jaxllm.tool_calling.calls import ExtractedToolCalls, ToolCall, new_call_id
from jaxllm.tool_calling.deltas import ContentDelta, ReasoningDelta, ToolCallDelta, assemble_tool_deltas
from jaxllm.tool_calling.forced import (MAX_PARALLEL_CALLS, NamedToolParser, RequiredToolParser, named_schema,
                                        required_schema)
from jaxllm.tool_calling.reasoning import (REASONING_PARSERS, ReasoningParser, ReasoningSplit, ReasoningStream,
                                           assemble_reasoning_deltas, get_reasoning_parser)
from jaxllm.tool_calling.registry import TOOL_PARSERS, get_tool_parser
from jaxllm.tool_calling.stream import ToolCallStream, ToolParser
from jaxllm.tool_calling.tools import validate_tool_choice, validate_tools

__all__ = ["ToolCall", "ExtractedToolCalls", "new_call_id", "ContentDelta", "ReasoningDelta", "ToolCallDelta",
           "assemble_tool_deltas", "ToolParser", "ToolCallStream", "TOOL_PARSERS", "get_tool_parser",
           "ReasoningParser", "ReasoningStream", "ReasoningSplit", "REASONING_PARSERS", "get_reasoning_parser",
           "assemble_reasoning_deltas", "validate_tools", "validate_tool_choice", "required_schema", "named_schema",
           "RequiredToolParser", "NamedToolParser", "MAX_PARALLEL_CALLS"]
