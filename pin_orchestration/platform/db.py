"""Engines for the platform database."""

from __future__ import annotations

import functools

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url

from pin_orchestration.platform.defaults import PGDATA_DIR
from pin_orchestration.platform.settings import Settings, SettingsError


class NoDatabaseHere(SettingsError):
    """An operator command found neither PIN_DATABASE_URL nor an embedded database under
    PIN_HOME: starting a new, empty one would only fail later, far from the cause."""


def describe_database(settings: Settings) -> str:
    """Which database a command uses, for an operator (no password)."""
    if settings.database_url:
        shown = make_url(settings.database_url).render_as_string(hide_password=True)
        return f"database {shown} (PIN_DATABASE_URL)"
    return f"the embedded PostgreSQL of PIN_HOME={settings.home}"


# libpq's connection parameters for a server that stops answering (hung, or the network
# to it): a connect gives up after 10 s; an idle connection is probed after 10 s and
# dropped after 3 unanswered probes 5 s apart; data the server's host never acknowledges
# fails the connection after 30 s (TCP only: a Unix socket has no such failure). They
# bound waits of the kernel's; a server that acknowledges but never answers is bounded by
# the statement and client-side timeouts of whoever must not wait (lock renewal:
# locks.py). A parameter given in the URL's query wins.
CONNECTION_DEFAULTS: dict[str, int] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


@functools.cache
def create_db_engine(url: str) -> Engine:
    """One pooled engine per URL for the life of the process."""
    given = make_url(url).query
    connect_args = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect_args
    )


def engine_from_env() -> Engine:
    """The platform database's engine, from the environment (the command line's way in).
    Never creates an embedded database: only `pin up` and `pin db upgrade` do."""
    return create_db_engine(resolve_database_url(Settings.from_env(), create_embedded=False))


def resolve_database_url(settings: Settings | None = None, *, create_embedded: bool = True) -> str:
    """PIN_DATABASE_URL when set; otherwise the embedded PostgreSQL under the PIN home
    (created there unless `create_embedded` is false: then NoDatabaseHere)."""
    settings = settings or Settings.from_env()
    if settings.database_url:
        return settings.database_url
    from pin_orchestration.platform.embedded import start_embedded_postgres

    if not create_embedded and not (settings.home / PGDATA_DIR).is_dir():
        raise NoDatabaseHere(
            f"no database: PIN_DATABASE_URL is unset and PIN_HOME={settings.home} holds no "
            "embedded PostgreSQL (PIN_HOME defaults to .pin in the current directory). Run "
            "where you ran `pin up` (./scripts/run keeps it in the repository's .pin), set "
            "PIN_HOME to that directory or PIN_DATABASE_URL, or create one here with "
            "`pin db upgrade`"
        )

    # Stopped when the last process using it exits: no server is left behind.
    return start_embedded_postgres(settings.home / PGDATA_DIR, stop_on_exit=True)


def dagster_storage_url(sqlalchemy_url: str) -> str:
    """The same database for Dagster's instance storage.

    dagster-postgres is written for psycopg2 (it binds NOTIFY payloads client-side, which
    psycopg 3's server-side binding rejects), and SQLAlchemy 2.1 maps a bare postgresql://
    to psycopg 3 — so name the driver explicitly.
    """
    url = make_url(sqlalchemy_url).set(drivername="postgresql+psycopg2")
    return url.render_as_string(hide_password=False)
