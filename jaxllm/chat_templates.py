"""Chat template options a user gives: a template of their own (`--chat-template`, LLM.chat(chat_template=...))
and values for the template's variables (`chat_template_kwargs`, `--default-chat-template-kwargs`).

    load_chat_template(value)   a file's text, or the template given inline; compiled once in jinja2's immutable
                                sandbox (as Hugging Face renders it), so a syntax error is a ValueError naming the
                                line before anything runs
    template_kwargs(*dicts)     the merged variables (later dicts win); names that are apply_chat_template's own
                                arguments are refused, as a template variable cannot set them
"""

from __future__ import annotations

import os
from typing import Any

# apply_chat_template's own arguments: set by jaxllm from the request's fields, never by chat_template_kwargs
RESERVED_KWARGS = ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                   "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                   "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")


def load_chat_template(value: str | os.PathLike) -> str:
    """The template text: read from `value` when it names a file, else `value` itself when it holds Jinja markup.
    ValueError when it is neither, or does not compile."""
    text = str(value)
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    elif not any(marker in text for marker in ("{{", "{%")):
        raise ValueError(f"chat template {str(value)[:200]!r} is neither a file nor a Jinja template")
    check_compiles(text)
    return text


def check_compiles(template: str) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    except TemplateSyntaxError as e:
        raise ValueError(f"chat template: line {e.lineno}: {e.message}") from None


def template_kwargs(*layers: dict[str, Any] | None) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, dict) or not all(isinstance(k, str) for k in layer):
            raise ValueError(f"chat_template_kwargs must be an object of names to values, got {layer!r}")
        reserved = sorted(set(layer) & set(RESERVED_KWARGS))
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)} (an argument of the chat "
                             f"template's rendering, set from the request)")
        merged.update(layer)
    return merged
