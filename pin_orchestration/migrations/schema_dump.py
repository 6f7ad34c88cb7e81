"""schema.sql: the schema at head as `pg_dump --schema-only` writes it, so a reviewer reads a
changed function or index as a diff of one file (procrastinate's habit). `pin db
dump-schema > schema.sql` regenerates it; tests/migrations/test_schema.py checks that the
migrations produce exactly it.

The dump is made on a scratch database migrated to head, never on a database in use, and
by the newest pg_dump at hand: the one the embedded PostgreSQL (pgserver) ships, or the
machine's when that is newer (a pg_dump refuses a server newer than itself). Lines that
name the versions or set session options are left out (and a column option some server
builds stamp on every column), so a 15 and a 16 server give the same file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from pin_orchestration.migrations import upgrade_database

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "schema.sql"

_VERSION = re.compile(r"(\d+)(?:\.(\d+))?")
_DROPPED_LINE = re.compile(
    r"^(-- Dumped (from|by) |SET |SELECT pg_catalog\.set_config\()"
    # A per-column option some server builds stamp on every column (not the project's).
    r"|ALTER TABLE ONLY \S+ ALTER COLUMN \S+ SET \(pg_attver=\d+\);$"
)


def pg_dump_binary() -> str:
    """The newest pg_dump available: pgserver's, or the one on PATH."""
    candidates: list[str] = []
    try:
        import pgserver

        bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_dump"
        if bundled.exists():
            candidates.append(str(bundled))
    except ImportError:
        pass
    on_path = shutil.which("pg_dump")
    if on_path:
        candidates.append(on_path)
    if not candidates:
        raise RuntimeError("no pg_dump found: install pgserver (a dependency) or postgresql-client")

    def version(binary: str) -> tuple[int, int]:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
        found = _VERSION.search(out.stdout.rsplit(")", 1)[-1])
        return (int(found.group(1)), int(found.group(2) or 0)) if found else (0, 0)

    return max(candidates, key=version)


def libpq_url(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def dump_schema(database_url: str) -> str:
    """The normalised `pg_dump --schema-only` of one database."""
    out = subprocess.run(
        [
            pg_dump_binary(),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "--no-tablespaces",
            "--dbname",
            libpq_url(database_url),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line for line in out.splitlines() if not _DROPPED_LINE.match(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


@contextmanager
def scratch_database(server_url: str, prefix: str = "pin_schema") -> Iterator[str]:
    """A new empty database on the server of `server_url`, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def schema_at_head(server_url: str) -> str:
    """What schema.sql should hold: a scratch database migrated to head, dumped."""
    with scratch_database(server_url) as url:
        upgrade_database(url)
        return dump_schema(url)
