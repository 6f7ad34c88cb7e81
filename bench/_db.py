"""Shared set-up of the benchmarks: a scratch database of their own, migrated to head."""

from __future__ import annotations

import os

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from pin_orchestration.migrations import upgrade_database
from pin_orchestration.platform.db import resolve_database_url
from pin_orchestration.platform.settings import Settings


def fresh_bench_database(name: str) -> str:
    """(Re)create database `name` on the PIN_DATABASE_URL server (else the embedded one)."""
    server_url = resolve_database_url(Settings.from_env(os.environ))
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    upgrade_database(url)
    return url
