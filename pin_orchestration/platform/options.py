"""Each job's options and each deployment setting are declared once, as a field of a frozen
dataclass in its domain module; the Dagster run config, the `pin` command-line options, the
environment readers (`settings.read_settings`) and docs/configuration.md are derived from
it here, so a default or a description cannot drift between them.

A job's option is declared with `option(default, "help")`. A StrEnum field is a plain
string in run config and a choice on the command line, carrying the enum's values (the
contract: `scope: DailyWindow`), and the domain's `validate()` names the field on a bad
value. A job that exposes only some of a set's options passes their `names`.

A setting is declared with `setting(default, env="PIN_…", help="…")`: the variable it is
read from, and how its value is parsed (by the field's type, or `parse`), bounded (`check`)
and told in errors and docs (`unit`, `accepts`, `shown`, `group`). An options set takes a
setting over with `same_as(SettingsClass, "field")`; a job that exposes it makes it
optional in run config and on the command line, empty meaning the variable's value.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

_HELP = "help"
_VARIABLE = "variable"

T = TypeVar("T")


def option(default: Any, help: str = "") -> Any:  # noqa: A002 — click's word for it
    """A dataclass field with its help text (shown in the Launchpad and `--help`)."""
    return dataclasses.field(default=default, metadata={_HELP: help})


@dataclass(frozen=True)
class Check:
    """A bound a setting's parsed value must hold, and how an error says it ("> 0")."""

    says: str
    holds: Callable[[Any], bool]


POSITIVE = Check("> 0", lambda value: value > 0)
NON_NEGATIVE = Check(">= 0", lambda value: value >= 0)


def between(low: float, high: float) -> Check:
    return Check(f"between {_number(low)} and {_number(high)}", lambda v: low <= v <= high)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Variable:
    """Where a setting comes from and how it is told: see `setting`."""

    names: tuple[str, ...]
    parse: Callable[[str], Any] | None = None
    check: Check | None = None
    unit: str = ""
    accepts: str = ""
    shown: str = ""
    group: str = ""
    redact: Callable[[str], str] | None = None

    @property
    def name(self) -> str:
        return self.names[0]

    def accepted(self, hint: Any) -> str:
        """What a value must be, for an error message: declared, or said from the type,
        the unit and the check ("seconds > 0 (fractions allowed)")."""
        if self.accepts:
            return self.accepts
        says = f" {self.check.says}" if self.check else ""
        kind = plain_type(hint)
        if kind is int:
            return f"a number of {self.unit}{says}" if self.unit else f"an integer{says}"
        if kind is float:
            return f"{self.unit or 'a number'}{says} (fractions allowed)"
        return f"a {getattr(kind, '__name__', kind)}{says}"


def setting(
    default: Any = dataclasses.MISSING,
    *,
    env: str | tuple[str, ...],
    help: str,  # noqa: A002 — click's word for it
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    parse: Callable[[str], Any] | None = None,
    check: Check | None = None,
    unit: str = "",
    accepts: str = "",
    shown: str = "",
    group: str = "",
    redact: Callable[[str], str] | None = None,
) -> Any:
    """A dataclass field read from the environment variable `env` (a tuple: the first one
    set wins). The text is parsed by the field's type (int, float: finite, str, Path) or by
    `parse` (a ValueError's message is shown), then must hold `check`. An error says the
    value must be `accepts` (by default said from the type, `unit` and `check`); docs and
    errors say the default as `shown` (markdown) when the value alone does not tell it.
    `help` is the meaning (docs/configuration.md, Launchpad, `--help`); `group` its
    heading there. `redact` says a secret's bad value without showing it."""
    if default is dataclasses.MISSING and not shown:
        raise TypeError(f"{env}: a setting with a default_factory says its default as shown=")
    names = (env,) if isinstance(env, str) else tuple(env)
    variable = Variable(names, parse, check, unit, accepts, shown, group, redact)
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        metadata={_HELP: help, _VARIABLE: variable},
    )


def same_as(settings_cls: type, name: str) -> Any:
    """The field `name` of `settings_cls` again (default, help, variable) for an options
    set that takes the setting over, so its default is declared in one place."""
    source = {f.name: f for f in dataclasses.fields(settings_cls)}[name]
    return dataclasses.field(
        default=source.default, default_factory=source.default_factory, metadata=source.metadata
    )


def variable_of(f: dataclasses.Field[Any]) -> Variable | None:
    return f.metadata.get(_VARIABLE)


def help_of(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get(_HELP) or ""


def settings_fields(
    settings_cls: type,
) -> list[tuple[dataclasses.Field[Any], Any, Variable]]:
    """The fields of `settings_cls` read from the environment, with type and variable."""
    return [
        (f, hint, variable)
        for f, hint in _fields(settings_cls)
        if (variable := variable_of(f)) is not None
    ]


def default_text(f: dataclasses.Field[Any]) -> str:
    """A setting's default as docs/configuration.md says it (markdown)."""
    variable = variable_of(f)
    if variable is not None and variable.shown:
        return variable.shown
    value = _plain(f.default)
    if value is None or value == ():
        return "none"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


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


def plain_type(hint: Any) -> Any:
    """`float | None` → float: an option that may be empty takes its type's values."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(hint) and len(args) == 1 else hint


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


def _exposed(f: dataclasses.Field[Any], hint: Any) -> tuple[Any, Any, str | None]:
    """How run config and the command line offer a field: (type, default, help). A setting
    taken over (`same_as`) is optional there: empty means its variable's value."""
    variable = variable_of(f)
    if variable is None:
        return hint, _plain(f.default), help_of(f) or None
    help_text = "; ".join(filter(None, [help_of(f), f"empty → {variable.name}"]))
    return plain_type(hint) | None, None, help_text


def with_settings(options_cls: type[T], settings: Any, **given: Any) -> T:
    """`options_cls` from the given values; a setting it takes over (`same_as`) that is not
    given (or None) has `settings`' value."""
    values = dict(given)
    for f in dataclasses.fields(options_cls):  # type: ignore[arg-type]
        if variable_of(f) is not None and values.get(f.name) is None:
            values[f.name] = getattr(settings, f.name)
    return options_cls(**values)


def dagster_config(
    options_cls: type, name: str, doc: str = "", names: Sequence[str] | None = None
) -> type:
    """A Dagster `Config` class with one field per option (or per named option); its
    `to_options(settings)` builds the options, empty settings taken from `settings`."""
    from dagster import Config
    from pydantic import Field, create_model

    definitions: dict[str, Any] = {}
    for f, hint in _fields(options_cls, names):
        kind, default, description = _exposed(f, hint)
        definitions[f.name] = (
            str if _is_enum(hint) else kind,
            Field(default=default, description=description),
        )

    def to_options(self: Any, settings: Any = None) -> Any:
        if settings is None:
            return options_cls(**self.model_dump())
        return with_settings(options_cls, settings, **self.model_dump())

    config = create_model(name, __base__=Config, __doc__=doc or None, **definitions)
    config.to_options = to_options  # type: ignore[attr-defined]
    return config


def click_options(
    options_cls: type, names: Sequence[str] | None = None
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a click command with `--field-name` for every option (or every named one),
    defaults shown; the command receives them as keyword arguments named like the fields
    (a setting taken over is None when not given: `with_settings` fills it)."""
    import click

    def decorate(command: Callable[..., T]) -> Callable[..., T]:
        for f, hint in reversed(_fields(options_cls, names)):
            _, default, help_text = _exposed(f, hint)
            command = click.option(
                f"--{f.name.replace('_', '-')}",
                f.name,
                type=click.Choice([m.value for m in hint]) if _is_enum(hint) else plain_type(hint),
                default=default,
                show_default=True,
                help=help_text,
            )(command)
        return command

    return decorate
