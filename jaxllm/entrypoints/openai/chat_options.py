"""The server's chat settings (vLLM's flags of the same names) and how a request's messages reach the template.

    --chat-template FILE|TEMPLATE        the template instead of the model's (checked at start-up)
    --default-chat-template-kwargs JSON  values of the template's variables, under each request's own
    --trust-request-chat-template        let a request send its own `chat_template` (refused otherwise)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from jaxllm.chat_templates import load_chat_template, template_kwargs


@dataclasses.dataclass(frozen=True)
class ChatOptions:
    chat_template: str | None = None  # the template's text (load_chat_template)
    default_template_kwargs: dict[str, Any] | None = None
    trust_request_chat_template: bool = False

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


def chat_options(args: argparse.Namespace) -> ChatOptions:
    return ChatOptions(args.chat_template, args.default_chat_template_kwargs, args.trust_request_chat_template)


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
