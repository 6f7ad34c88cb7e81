"""An option set is declared once, as a frozen dataclass whose fields carry their help
text (`option`); the Dagster run config and the click options of the same set are derived
from it, so a default or a description cannot drift between the three."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def option(default: Any, help: str) -> Any:  # noqa: A002 — click's and pydantic's word
    """A dataclass field with its default and its help text."""
    return dataclasses.field(default=default, metadata={"help": help})


def _fields(options: type, names: Sequence[str]) -> list[tuple[str, type, Any, str]]:
    hints = typing.get_type_hints(options)
    by_name = {f.name: f for f in dataclasses.fields(options)}
    unknown = set(names) - set(by_name)
    if unknown:
        raise ValueError(f"{options.__name__} has no option(s) {sorted(unknown)}")
    return [
        (name, hints[name], by_name[name].default, by_name[name].metadata.get("help", ""))
        for name in names
    ]


def dagster_config(name: str, options: type, names: Sequence[str]) -> type:
    """A Dagster `Config` class with the named fields of `options` (type, default, help)."""
    from dagster import Config
    from pydantic import Field, create_model

    return create_model(  # type: ignore[call-overload]
        name,
        __base__=Config,
        **{
            field: (hint, Field(default=default, description=help))
            for field, hint, default, help in _fields(options, names)
        },
    )


def click_options(options: type, names: Sequence[str]) -> Callable[[F], F]:
    """Decorate a click command with `--field-name` options for the named fields."""

    def decorate(command: F) -> F:
        for field, hint, default, help in reversed(_fields(options, names)):
            command = click.option(
                f"--{field.replace('_', '-')}",
                field,
                type=hint,
                default=default,
                show_default=True,
                help=help,
            )(command)
        return command

    return decorate
