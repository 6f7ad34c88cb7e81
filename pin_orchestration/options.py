"""Each job's options are declared once, as a frozen dataclass in its domain module; the
Dagster run config and the `pin` command-line options are derived from it here.

A field is declared with `option(default, "help")`. A StrEnum field is a plain string in
run config and a choice on the command line, carrying the enum's values (the contract:
`scope: DailyWindow`), and the domain's `validate()` names the field on a bad value.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Callable
from typing import Any, TypeVar

_HELP = "help"

T = TypeVar("T")


def option(default: Any, help: str = "") -> Any:  # noqa: A002 — click's word for it
    """A dataclass field with its help text (shown in the Launchpad and `--help`)."""
    return dataclasses.field(default=default, metadata={_HELP: help})


def _fields(options_cls: type) -> list[tuple[dataclasses.Field[Any], type]]:
    hints = typing.get_type_hints(options_cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(options_cls)]


def _plain(default: Any) -> Any:
    return default.value if isinstance(default, enum.Enum) else default


def dagster_config(options_cls: type, name: str, doc: str) -> type:
    """A Dagster `Config` class with one field per option, and `to_options()`."""
    from dagster import Config
    from pydantic import Field, create_model

    definitions: dict[str, Any] = {}
    for f, hint in _fields(options_cls):
        annotation = str if isinstance(hint, type) and issubclass(hint, enum.Enum) else hint
        definitions[f.name] = (
            annotation,
            Field(default=_plain(f.default), description=f.metadata.get(_HELP) or None),
        )

    def to_options(self: Any) -> Any:
        return options_cls(**self.model_dump())

    config = create_model(name, __base__=Config, __doc__=doc, **definitions)
    config.to_options = to_options  # type: ignore[attr-defined]
    return config


def click_options(options_cls: type) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a click command with `--field-name` for every option (defaults shown); the
    command receives them as keyword arguments named like the fields."""
    import click

    def decorate(command: Callable[..., T]) -> Callable[..., T]:
        for f, hint in reversed(_fields(options_cls)):
            is_enum = isinstance(hint, type) and issubclass(hint, enum.Enum)
            command = click.option(
                f"--{f.name.replace('_', '-')}",
                f.name,
                type=click.Choice([m.value for m in hint]) if is_enum else hint,
                default=_plain(f.default),
                show_default=True,
                help=f.metadata.get(_HELP) or None,
            )(command)
        return command

    return decorate
