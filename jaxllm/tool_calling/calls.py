"""ToolCall and ExtractedToolCalls: what a tool-call parser reads out of a whole output (OpenAI's shapes).

A call's arguments are the text of a JSON object (as OpenAI sends them), written by `arguments_text` from the
value the model gave: non-ASCII characters kept as they are, NaN and infinities refused (they are not JSON).
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass
from typing import Any, NamedTuple

_ALPHANUMERIC = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text
    type: str = "function"

    def to_openai(self) -> dict:
        """The call as a chat completion message's `tool_calls` item."""
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": self.arguments}}


class ExtractedToolCalls(NamedTuple):
    content: str | None  # the text around the calls (None: there is none)
    tool_calls: list[ToolCall]


def new_call_id() -> str:
    """"call_" and 24 random letters and digits, as OpenAI's ids."""
    return "call_" + random_alphanumeric(24)


def random_alphanumeric(length: int) -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(length))


def arguments_text(value: Any) -> str | None:
    """The JSON text of a call's arguments: `value` a dict, or the JSON text of one (some models write the
    arguments as a string). None when it is neither, or holds NaN or an infinity."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return None
