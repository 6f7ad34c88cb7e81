"""Engines for the platform database."""

from __future__ import annotations

import functools

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

from pin_orchestration.settings import Settings


@functools.cache
def create_db_engine(url: str) -> Engine:
    """One pooled engine per URL for the life of the process."""
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def engine_from_env() -> Engine:
    """The platform database's engine, from the environment (the command line's way in)."""
    return create_db_engine(resolve_database_url(Settings.from_env()))


def resolve_database_url(settings: Settings | None = None) -> str:
    """PIN_DATABASE_URL when set; otherwise the embedded PostgreSQL under the PIN home."""
    settings = settings or Settings.from_env()
    if settings.database_url:
        return settings.database_url
    from pin_orchestration.embedded import start_embedded_postgres

    # Stopped when the last process using it exits: no server is left behind.
    return start_embedded_postgres(settings.home / "pgdata", stop_on_exit=True)


def dagster_storage_url(sqlalchemy_url: str) -> str:
    """The same database for Dagster's instance storage.

    dagster-postgres is written for psycopg2 (it binds NOTIFY payloads client-side, which
    psycopg 3's server-side binding rejects), and SQLAlchemy 2.1 maps a bare postgresql://
    to psycopg 3 — so name the driver explicitly.
    """
    url = make_url(sqlalchemy_url).set(drivername="postgresql+psycopg2")
    return url.render_as_string(hide_password=False)
