"""The embedded PostgreSQL (pgserver) that stands in when PIN_DATABASE_URL is unset.

Its data directory lives under the PIN home, so state survives restarts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

EMBEDDED_DATABASE = "pin"


def start_embedded_postgres(data_dir: Path, *, stop_on_exit: bool = False) -> str:
    """Start (or reuse) the embedded server and return a SQLAlchemy URL of its `pin` database.

    With `stop_on_exit` the server stops when this process exits and no other process uses
    it; otherwise it keeps running, so later commands reuse it without a restart.
    """
    import pgserver  # imported lazily: only the embedded default needs it

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data_dir, cleanup_mode="stop" if stop_on_exit else None)
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{EMBEDDED_DATABASE}';")
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {EMBEDDED_DATABASE};")
        log.info(
            "created database %s in the embedded PostgreSQL at %s", EMBEDDED_DATABASE, data_dir
        )
    url = make_url(server.get_uri()).set(
        drivername="postgresql+psycopg", database=EMBEDDED_DATABASE
    )
    return url.render_as_string(hide_password=False)


def stop_embedded_postgres(data_dir: Path) -> None:
    """Release this process's handle on the server; the last handle stops it."""
    import pgserver

    pgserver.get_server(data_dir, cleanup_mode="stop").cleanup()


def running_embedded_url(data_dir: Path) -> str | None:
    """The URL of the embedded server already running on `data_dir`, or None: never starts
    one (a server started here would stop with the asking process)."""
    from pgserver.utils import PostmasterInfo  # imported lazily, as pgserver above

    info = PostmasterInfo.read_from_pgdata(data_dir)
    if info is None or not info.is_running() or info.status != "ready":
        return None
    url = make_url(info.get_uri(database=EMBEDDED_DATABASE))
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
