"""One settings object, read from the environment when asked for — never at import time."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Where `pin up` starts the selections stand-in when PIN_SELECTIONS_URL is unset.
LOCAL_SELECTIONS_PORT = 8790


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


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
    # selections internal API (m2m) for the snapshot-detach retry; None → the local
    # stand-in that `pin up` starts.
    selections_url: str | None = None
    selections_token: str | None = None
    # PollingInterval of news-snapshot-detach-retry: at most one drain run per window.
    snapshot_detach_polling_seconds: float = 300.0
    # What a run prints to its process's stderr (the UI keeps every event whatever this is);
    # `pin up` sets it from --log-level, so an idle stack's drains and sweeps stay quiet.
    run_log_level: str = "INFO"

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
        selections_url = env.get("PIN_SELECTIONS_URL") or None
        if selections_url is not None and not selections_url.startswith(("http://", "https://")):
            raise SettingsError(
                f"PIN_SELECTIONS_URL must be an http(s):// base URL (got {selections_url!r}); "
                "unset it to use the local selections stand-in"
            )
        polling = env.get("PIN_SNAPSHOT_DETACH_POLLING_SECONDS") or "300"
        try:
            polling_seconds = float(polling)
        except ValueError:
            polling_seconds = 0.0
        if polling_seconds <= 0:
            raise SettingsError(
                f"PIN_SNAPSHOT_DETACH_POLLING_SECONDS must be a number of seconds > 0 "
                f"(got {polling!r}); default is 300"
            )
        run_log_level = (env.get("PIN_RUN_LOG_LEVEL") or "INFO").upper()
        if run_log_level not in LOG_LEVELS:
            raise SettingsError(
                f"PIN_RUN_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)} "
                f"(got {run_log_level!r}); default is INFO"
            )
        return cls(
            database_url=database_url,
            home=home,
            news_full_sweep_cron=cron,
            kafka_bootstrap_servers=env.get("PIN_KAFKA_BOOTSTRAP_SERVERS") or None,
            selections_url=selections_url,
            selections_token=env.get("PIN_SELECTIONS_TOKEN") or None,
            snapshot_detach_polling_seconds=polling_seconds,
            run_log_level=run_log_level,
        )
