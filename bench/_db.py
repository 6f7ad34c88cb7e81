"""Shared set-up of the benchmarks: a scratch database of their own, migrated to head."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
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


def drop_bench_database(name: str) -> None:
    """Drop the scratch database `name` made by `fresh_bench_database`."""
    server_url = resolve_database_url(Settings.from_env(os.environ))
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


ROOT = Path(__file__).resolve().parent.parent


def install_claim_0016(engine: Engine) -> str:
    """The claim of migrations 0011-0016 (a pick in about eight statements) as migration
    0017's down step restores it, created as `bench_0016.claim_jobs` (the baseline of the
    per-pick work, issue 15). Returns the function's name."""
    frozen = (
        ROOT / "pin_orchestration/migrations/versions/0017_scraping_claim_statements.down.sql"
    ).read_text(encoding="utf-8")
    start = frozen.index("CREATE OR REPLACE FUNCTION scraping.claim_jobs(")
    end = frozen.index("$fn$;", start) + len("$fn$;")
    body = frozen[start:end].replace(
        "FUNCTION scraping.claim_jobs(", "FUNCTION bench_0016.claim_jobs(", 1
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS bench_0016")
        conn.exec_driver_sql(body)
    return "bench_0016.claim_jobs"


def backend_cpu_ms(pid: int) -> float:
    """CPU time a PostgreSQL backend on this machine has run so far (Linux schedstat), NaN
    where it cannot be read: a claim's own cost, whatever else loads the machine."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6
    except (OSError, ValueError, IndexError):
        return float("nan")
