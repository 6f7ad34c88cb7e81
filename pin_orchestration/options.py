"""Each job's options are declared once, as a frozen dataclass in its domain module; the
Dagster run config and the `pin` command-line options are derived from it here, so a
default or a description cannot drift between the three.

A field is declared with `option(default, "help")`. A StrEnum field is a plain string in
run config and a choice on the command line, carrying the enum's values (the contract:
`scope: DailyWindow`), and the domain's `validate()` names the field on a bad value. A
job that exposes only some of a set's options passes their `names`.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

_HELP = "help"

T = TypeVar("T")


def option(default: Any, help: str = "") -> Any:  # noqa: A002 — click's word for it
    """A dataclass field with its help text (shown in the Launchpad and `--help`)."""
    return dataclasses.field(default=default, metadata={_HELP: help})


def _fields(
    options_cls: type, names: Sequence[str] | None = None
) -> list[tuple[dataclasses.Field[Any], type]]:
    hints = typing.get_type_hints(options_cls)
    by_name = {f.name: f for f in dataclasses.fields(options_cls)}
    if names is None:
        names = list(by_name)
    unknown = set(names) - set(by_name)
    if unknown:
        raise ValueError(f"{options_cls.__name__} has no option(s) {sorted(unknown)}")
    return [(by_name[n], hints[n]) for n in names]


def _plain(default: Any) -> Any:
    return default.value if isinstance(default, enum.Enum) else default


def _plain_type(hint: Any) -> Any:
    """`float | None` → float: an option that may be empty takes its type's values."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(hint) and len(args) == 1 else hint


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


def dagster_config(
    options_cls: type, name: str, doc: str = "", names: Sequence[str] | None = None
) -> type:
    """A Dagster `Config` class with one field per option (or per named option)."""
    from dagster import Config
    from pydantic import Field, create_model

    definitions: dict[str, Any] = {}
    for f, hint in _fields(options_cls, names):
        definitions[f.name] = (
            str if _is_enum(hint) else hint,
            Field(default=_plain(f.default), description=f.metadata.get(_HELP) or None),
        )

    def to_options(self: Any) -> Any:
        return options_cls(**self.model_dump())

    config = create_model(name, __base__=Config, __doc__=doc or None, **definitions)
    config.to_options = to_options  # type: ignore[attr-defined]
    return config


def click_options(
    options_cls: type, names: Sequence[str] | None = None
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a click command with `--field-name` for every option (or every named one),
    defaults shown; the command receives them as keyword arguments named like the fields."""
    import click

    def decorate(command: Callable[..., T]) -> Callable[..., T]:
        for f, hint in reversed(_fields(options_cls, names)):
            command = click.option(
                f"--{f.name.replace('_', '-')}",
                f.name,
                type=click.Choice([m.value for m in hint]) if _is_enum(hint) else _plain_type(hint),
                default=_plain(f.default),
                show_default=True,
                help=f.metadata.get(_HELP) or None,
            )(command)
        return command

    return decorate
