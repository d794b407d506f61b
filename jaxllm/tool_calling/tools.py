"""validate_tools and validate_tool_choice: a chat request's `tools` and `tool_choice`, checked as OpenAI's API
defines them. A refusal is a ValueError naming the field and the problem ("tools[2].function.parameters: ...").

    tools         a non-empty list of {"type": "function", "function": {"name", "description"?, "parameters"?,
                  "strict"?}}: names match ^[a-zA-Z0-9_-]{1,64}$ and are not declared twice; parameters is a valid
                  JSON Schema (checked by jsonschema against the draft it names, by default the latest) of an object
    tool_choice   "none", "auto", "required" (needs tools), or {"type": "function", "function": {"name": ...}}
                  naming a declared tool; None: the field was left out

Both take plain JSON values (a pydantic request's fields after model_dump()).
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_CHOICES = ("none", "auto", "required")


def validate_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise ValueError(f"tools: expected a list, got {_kind(tools)}")
    if not tools:
        raise ValueError("tools: an empty list (leave the field out for no tools)")
    declared: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = _check_tool(tool, f"tools[{i}]")
        if name in declared:
            raise ValueError(f"tools[{i}].function.name: {name!r} is declared twice (also tools[{declared[name]}])")
        declared[name] = i


def validate_tool_choice(tool_choice: Any, tools: list | None) -> None:
    """`tool_choice` against the request's `tools` (validated first)."""
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    if tool_choice == "required":
        if not tools:
            raise ValueError("tool_choice: 'required' needs tools, and the request declares none")
        return
    if isinstance(tool_choice, str):
        raise ValueError(f"tool_choice: {tool_choice!r} is not one of 'none', 'auto', 'required' or a function")
    if not isinstance(tool_choice, dict):
        raise ValueError(f"tool_choice: expected a string or an object, got {_kind(tool_choice)}")
    if tool_choice.get("type") != "function":
        raise ValueError(f"tool_choice.type: expected 'function', got {tool_choice.get('type')!r}")
    function = tool_choice.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("tool_choice.function: expected an object with a string `name`")
    names = [tool["function"]["name"] for tool in tools or []]
    if function["name"] not in names:
        declared = f"the declared ones are {', '.join(names)}" if names else "the request declares none"
        raise ValueError(f"tool_choice.function.name: {function['name']!r} is not a declared tool ({declared})")


def _check_tool(tool: Any, where: str) -> str:
    """The tool's function name, once the tool is checked."""
    if not isinstance(tool, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(tool)}")
    if tool.get("type") != "function":
        raise ValueError(f"{where}.type: expected 'function', got {tool.get('type')!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{where}.function: expected an object, got {_kind(function)}")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"{where}.function.name: {name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise ValueError(f"{where}.function.description: expected a string, got {_kind(function['description'])}")
    if function.get("strict") is not None and not isinstance(function["strict"], bool):
        raise ValueError(f"{where}.function.strict: expected true or false, got {_kind(function['strict'])}")
    if function.get("parameters") is not None:
        check_parameters(function["parameters"], f"{where}.function.parameters")
    return name


def check_parameters(schema: Any, where: str) -> None:
    """A function's parameters: a valid JSON Schema that describes an object."""
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: expected a JSON Schema object, got {_kind(schema)}")
    if schema.get("type", "object") != "object":
        raise ValueError(f"{where}: the arguments are an object: expected type 'object', got {schema['type']!r}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        at = "/".join(str(part) for part in e.path)
        raise ValueError(f"{where}: not a valid JSON Schema: {e.message}" + (f" (at {at})" if at else "")) from None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
