"""One settings object, read from the environment when asked for — never at import time.

Every setting is declared once, as a `setting(…)` field (pin_orchestration/platform/options.py):
`read_settings` reads any such class, and docs/configuration.md is generated from the
declarations (`python -m pin_orchestration.cli.configuration_doc` rewrites it; a test compares
them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pin_orchestration.platform.options import (
    POSITIVE,
    Variable,
    default_text,
    plain_type,
    setting,
    settings_fields,
)

# Where `pin up` starts the selections stand-in when PIN_SELECTIONS_URL is unset.
LOCAL_SELECTIONS_PORT = 8790


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

S = TypeVar("S")


class SettingsError(ValueError):
    """An environment variable holds a value the project cannot use."""


def http_url(raw: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise ValueError("")
    return raw


def _scheme(raw: str) -> str:
    """A database URL's scheme only: the rest may hold a password."""
    return repr(raw.split(":", 1)[0])


def _postgresql_url(raw: str) -> str:
    if not raw.startswith("postgresql"):
        raise ValueError("")
    return raw


def _cron(raw: str) -> str:
    if len(raw.split()) != 5:
        raise ValueError("")
    return raw


def _log_level(raw: str) -> str:
    if raw.upper() not in LOG_LEVELS:
        raise ValueError("")
    return raw.upper()


PLATFORM = "Platform: database, state, logs"
NEWS = "News and chessboard"


@dataclass(frozen=True)
class Settings:
    database_url: str | None = setting(
        None,
        env="PIN_DATABASE_URL",
        help="SQLAlchemy URL of the platform PostgreSQL (`postgresql+psycopg://…`)",
        parse=_postgresql_url,
        accepts="a PostgreSQL SQLAlchemy URL such as postgresql+psycopg://user@host:5432/dbname",
        shown="embedded PostgreSQL under `PIN_HOME`",
        group=PLATFORM,
        redact=_scheme,
    )
    dagster_pg_url: str | None = setting(
        None,
        env="PIN_DAGSTER_PG_URL",
        help="SQLAlchemy URL (`postgresql+psycopg2://…`) of Dagster's instance storage "
        "(dagster.yaml reads it; `pin up` and `pin env` set it)",
        shown="the platform database",
        group=PLATFORM,
    )
    home: Path = setting(
        env="PIN_HOME",
        help="state of the embedded default (PostgreSQL data, `DAGSTER_HOME`, local sinks)",
        default_factory=lambda: (Path.cwd() / ".pin").resolve(),
        shown="`./.pin`",
        group=PLATFORM,
    )
    # `pin up` sets it from --log-level, so an idle stack's drains and sweeps stay quiet.
    run_log_level: str = setting(
        "INFO",
        env="PIN_RUN_LOG_LEVEL",
        help="what runs print to the console (the UI keeps every event); `pin up` sets it",
        parse=_log_level,
        accepts=f"one of {', '.join(LOG_LEVELS)}",
        shown="`INFO` (`WARNING` under `pin up`)",
        group=PLATFORM,
    )
    news_full_sweep_cron: str = setting(
        "0 4 * * 0",
        env="PIN_NEWS_FULL_SWEEP_CRON",
        help="cron (Europe/Moscow) of the weekly FullSweep reconcile",
        parse=_cron,
        accepts="a 5-field cron expression, e.g. '0 4 * * 0' for Sundays at 04:00 Europe/Moscow",
        group=NEWS,
    )
    kafka_bootstrap_servers: str | None = setting(
        None,
        env="PIN_KAFKA_BOOTSTRAP_SERVERS",
        help="Kafka of the chessboard event publisher",
        shown="events go to `$PIN_HOME/chessboard-events.jsonl`",
        group=NEWS,
    )
    selections_url: str | None = setting(
        None,
        env="PIN_SELECTIONS_URL",
        help="base URL of the selections internal API (snapshot detach)",
        parse=http_url,
        accepts="an http(s):// base URL",
        shown=f"local stand-in on `127.0.0.1:{LOCAL_SELECTIONS_PORT}`, started by `pin up`",
        group=NEWS,
    )
    selections_token: str | None = setting(
        None,
        env="PIN_SELECTIONS_TOKEN",
        help="m2m bearer token for selections",
        group=NEWS,
    )
    snapshot_detach_polling_seconds: float = setting(
        300.0,
        env="PIN_SNAPSHOT_DETACH_POLLING_SECONDS",
        help="PollingInterval: at most one detach drain run per window",
        check=POSITIVE,
        unit="seconds",
        group=NEWS,
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        return read_settings(cls, environ)


def read_settings(settings_cls: type[S], environ: Mapping[str, str] | None = None) -> S:
    """`settings_cls` with each `setting` read from its variable (the first set, of its
    names); unset or blank, the declared default. A bad value raises SettingsError naming
    the variable, what it accepts and the default."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f, hint, variable in settings_fields(settings_cls):
        for name in variable.names:
            raw = (env.get(name) or "").strip()
            if raw:
                values[f.name] = _parsed(variable, hint, name, raw, default_text(f))
                break
    return settings_cls(**values)


def _parsed(variable: Variable, hint: Any, name: str, raw: str, default: str) -> Any:
    parse = variable.parse or _TYPE_PARSERS.get(plain_type(hint))
    if parse is None:  # a declaration's mistake, not the operator's
        raise TypeError(f"{name}: no parser for {hint!r}; declare one with setting(parse=…)")
    reason = ""
    try:
        value = parse(raw)
        valid = variable.check is None or variable.check.holds(value)
    except (ValueError, TypeError) as exc:
        # A declared parser says why; the type's own message would only repeat the value.
        reason, valid = (str(exc) if variable.parse else ""), False
    if valid:
        return value
    got = variable.redact(raw) if variable.redact else repr(raw)
    raise SettingsError(
        f"{name} must be {variable.accepted(hint)} (got {got}"
        + (f": {reason}" if reason else "")
        + f"); unset it for the default: {default.replace('`', '')}"
    )


def _finite(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


_TYPE_PARSERS: dict[Any, Callable[[str], Any]] = {
    int: int,
    float: _finite,
    str: str,
    Path: lambda raw: Path(raw).expanduser().resolve(),
}
