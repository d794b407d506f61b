"""The server's chat settings (vLLM's flags of the same names) and how a request's messages reach the template.

    --chat-template FILE|TEMPLATE        the template instead of the model's (checked at start-up)
    --default-chat-template-kwargs JSON  values of the template's variables, under each request's own
    --trust-request-chat-template        let a request send its own `chat_template` (refused otherwise)
    --enable-auto-tool-choice --tool-call-parser NAME   tool_choice "auto": calls read from the reply's text
    --reasoning-parser NAME              the reply's <think>...</think> returned apart, as reasoning_content

reply_reader(request) says how a request's reply is read (chat_reply.py): tools and tool_choice are checked there
(a ValueError naming the field), and tool_choice "required" or a named function gives the JSON schema its reply
is constrained to.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from jaxllm.chat_templates import load_chat_template, template_kwargs
from jaxllm.entrypoints.openai.chat_reply import ReplyReader
from jaxllm.tool_calling import (REASONING_PARSERS, TOOL_PARSERS, get_reasoning_parser, get_tool_parser,
                                 named_schema, required_schema, validate_tool_choice, validate_tools)


@dataclasses.dataclass(frozen=True)
class ChatOptions:
    chat_template: str | None = None  # the template's text (load_chat_template)
    default_template_kwargs: dict[str, Any] | None = None
    trust_request_chat_template: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (one of "
                             f"{', '.join(TOOL_PARSERS)})")

    def reply_reader(self, tools: list | None, tool_choice, parallel_tool_calls: bool | None,
                     template_kwargs: dict) -> tuple[ReplyReader | None, dict | None]:
        """(how the reply is read, None: as plain text; the JSON schema a forced tool_choice constrains it to)."""
        if tools is not None:
            validate_tools(tools)
        validate_tool_choice(tool_choice, tools)
        choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
        reasoning = None if self.reasoning_parser is None else get_reasoning_parser(self.reasoning_parser)
        thinking = template_kwargs.get("enable_thinking", True) is not False
        if choice == "auto" and tools:
            if not self.enable_auto_tool_choice:
                raise ValueError('tool_choice: "auto" needs the server\'s --enable-auto-tool-choice and '
                                 '--tool-call-parser (or send tool_choice "none", "required" or a function)')
            return ReplyReader(reasoning, thinking, get_tool_parser(self.tool_call_parser)), None
        if choice == "required":
            schema = required_schema(tools, parallel_tool_calls=parallel_tool_calls is not False)
            return ReplyReader(reasoning, thinking, forced="required"), schema
        if isinstance(choice, dict):
            name = choice["function"]["name"]
            return ReplyReader(reasoning, thinking, forced=name, named=True), named_schema(tools, name)
        return (None if reasoning is None else ReplyReader(reasoning, thinking)), None

    def template_for(self, requested: str | None) -> str | None:
        """The template a request renders with: its own (when trusted; ValueError otherwise), else the server's."""
        if requested is None:
            return self.chat_template
        if not self.trust_request_chat_template:
            raise ValueError("chat_template: a request's own chat template needs the server's "
                             "--trust-request-chat-template")
        return load_chat_template_inline(requested)

    def kwargs_for(self, requested: dict[str, Any] | None) -> dict[str, Any]:
        """The server's default template variables under the request's (ValueError naming chat_template_kwargs)."""
        return template_kwargs(self.default_template_kwargs, requested)


def load_chat_template_inline(text: str) -> str:
    """A request's template: its text only (never a path on the server's disk)."""
    if not any(marker in text for marker in ("{{", "{%")):
        raise ValueError("chat_template: not a Jinja template")
    try:
        return load_chat_template(text)
    except ValueError as e:
        raise ValueError(f"chat_template: {e}") from None


def add_chat_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chat-template", type=_template_flag, default=None,
                        help="a chat template (a file, or the template itself) instead of the model's")
    parser.add_argument("--default-chat-template-kwargs", type=_kwargs_flag, default=None,
                        help='JSON object of chat template variables every request gets, e.g. '
                             '\'{"enable_thinking": false}\' (a request\'s chat_template_kwargs win)')
    parser.add_argument("--trust-request-chat-template", action="store_true", default=False,
                        help="accept a request's own chat_template (it runs in the template sandbox, under the "
                             "time and memory bounds)")
    parser.add_argument("--enable-auto-tool-choice", action="store_true", default=False,
                        help='tool_choice "auto": tool calls read from the reply with --tool-call-parser')
    parser.add_argument("--tool-call-parser", choices=TOOL_PARSERS, default=None,
                        help="the format of the model's tool calls")
    parser.add_argument("--reasoning-parser", choices=REASONING_PARSERS, default=None,
                        help="return the reply's <think>...</think> as reasoning_content")


def chat_options(args: argparse.Namespace) -> ChatOptions:
    """ChatOptions from the flags (ValueError: flags that do not go together)."""
    return ChatOptions(args.chat_template, args.default_chat_template_kwargs, args.trust_request_chat_template,
                       args.enable_auto_tool_choice, args.tool_call_parser, args.reasoning_parser)


def _template_flag(text: str) -> str:
    try:
        return load_chat_template(text)
    except (ValueError, OSError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _kwargs_flag(text: str) -> dict:
    try:
        value = json.loads(text)
        return template_kwargs(value)
    except (json.JSONDecodeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
