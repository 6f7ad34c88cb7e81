"""One settings object, read from the environment when asked for — never at import time."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class SettingsError(ValueError):
    """An environment variable holds a value the project cannot use."""


@dataclass(frozen=True)
class Settings:
    # SQLAlchemy URL of the PostgreSQL that holds the platform tables. None selects the
    # embedded PostgreSQL kept under `home`.
    database_url: str | None
    # Where the embedded default keeps its state (PostgreSQL data, Dagster home, local sinks).
    home: Path
    # Cron of the weekly FullSweep reconcile (Europe/Moscow).
    news_full_sweep_cron: str
    # Kafka bootstrap servers of the chessboard event publisher. None selects the local
    # JSONL sink under `home` (embedded default).
    kafka_bootstrap_servers: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        database_url = env.get("PIN_DATABASE_URL") or None
        if database_url is not None and not database_url.startswith("postgresql"):
            raise SettingsError(
                "PIN_DATABASE_URL must be a PostgreSQL SQLAlchemy URL such as "
                "postgresql+psycopg://user@host:5432/dbname "
                f"(got {database_url.split(':', 1)[0]!r}); unset it to use the embedded PostgreSQL"
            )
        home = Path(env.get("PIN_HOME") or Path.cwd() / ".pin").expanduser().resolve()
        cron = env.get("PIN_NEWS_FULL_SWEEP_CRON") or "0 4 * * 0"
        if len(cron.split()) != 5:
            raise SettingsError(
                f"PIN_NEWS_FULL_SWEEP_CRON must be a 5-field cron expression (got {cron!r}), "
                "e.g. '0 4 * * 0' for Sundays at 04:00 Europe/Moscow"
            )
        return cls(
            database_url=database_url,
            home=home,
            news_full_sweep_cron=cron,
            kafka_bootstrap_servers=env.get("PIN_KAFKA_BOOTSTRAP_SERVERS") or None,
        )
