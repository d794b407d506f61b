"""Command-line flags generated from EngineArgs, so that every engine argument is a flag of `jaxllm serve` and
`jaxllm generate` and the two cannot drift from the dataclass or from each other.

A field becomes `--field-name` (dashes for underscores) with the field's default; its type comes from the
annotation (`int | None` parses as int, unset stays None) or from the field's own parse function (a ValueError
it raises is the flag's error), a bool field becomes `--name/--no-name`, and the help text and any fixed choices
come from the field's metadata.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from jaxllm.engine.args import EngineArgs


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one flag per EngineArgs field to `parser`; EngineArgs.from_cli_args reads them back."""
    group = parser.add_argument_group("engine arguments", "every EngineArgs field (see jaxllm.engine.args)")
    annotations = typing.get_type_hints(EngineArgs)
    for field in dataclasses.fields(EngineArgs):
        group.add_argument(flag_name(field.name), **_flag_options(field, annotations[field.name]))
    return parser


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _flag_options(field: dataclasses.Field, annotation: typing.Any) -> dict:
    help_text = field.metadata["help"].replace("%", "%%") + " (default: %(default)s)"
    options = {"dest": field.name, "default": field.default, "help": help_text}
    if annotation is bool:
        return {**options, "action": argparse.BooleanOptionalAction}
    options["type"] = _flag_parser(field.metadata["parse"]) if "parse" in field.metadata else value_type(annotation)
    if "choices" in field.metadata:
        options["choices"] = (*field.metadata["choices"], *field.metadata.get("aliases", ()))
    return options


def _flag_parser(parse: typing.Callable[[str], typing.Any]) -> typing.Callable[[str], typing.Any]:
    """parse, its ValueError an argparse error ("argument --flag: <message>")."""
    def parse_flag(text: str) -> typing.Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse_flag


def value_type(annotation: typing.Any) -> type:
    """The type a flag's text is parsed to: the annotation, or X for `X | None`."""
    members = [t for t in typing.get_args(annotation) if t is not type(None)]
    if len(members) > 1:
        raise TypeError(f"EngineArgs fields must be one type or that type | None, got {annotation}")
    return members[0] if members else annotation
