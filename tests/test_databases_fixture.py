"""The test databases the suite hands out (tests/conftest.py `_Databases`): a database a test
gave back and the next one takes is as every migration left it, and nothing of the test
that had it reaches it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from tests.conftest import _Databases, _with_database


@pytest.fixture
def databases(
    pg_server_url: str, admin_engine: Engine, template_database: str
) -> Iterator[_Databases]:
    databases = _Databases(pg_server_url, admin_engine, template_database)
    yield databases
    databases.close()


def _contents(url: str) -> dict[str, object]:
    """Every user table's rows and every sequence's state."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            tables = conn.execute(
                text(
                    "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables"
                    " WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
                )
            ).scalars()
            contents: dict[str, object] = {
                t: sorted(map(str, conn.execute(text(f"SELECT * FROM {t}")))) for t in tables
            }
            for (sequence,) in conn.execute(
                text("SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences")
            ).all():
                # Read, not advanced: nextval would move the template's own sequences.
                contents[sequence] = tuple(
                    conn.execute(text(f"SELECT last_value, is_called FROM {sequence}")).one()
                )
        return contents
    finally:
        engine.dispose()


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_a_database_given_back_is_handed_out_again_as_the_migrations_left_it(
    pg_server_url: str, template_database: str, databases: _Databases
) -> None:
    fresh = _contents(_with_database(pg_server_url, template_database))
    first = databases.take()
    url = _with_database(pg_server_url, first)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO pin.job_runs (job_code, run_id, status, started_at)"
                " VALUES ('x', 'y', 'succeeded', now())"
            )
        )
        conn.execute(text("DELETE FROM scraping.pick_classes WHERE priority = 'low'"))
        conn.execute(text("UPDATE scraping.pick_class_clocks SET tenant_clock[2] = 7"))
        conn.execute(text("SELECT nextval('scraping.webhook_deliveries_id_seq')"))
    # A session the test left open (a thread or a child of it, still running).
    lingering = psycopg.connect(_libpq(url), autocommit=True)
    engine.dispose()
    databases.give_back(first)
    second = databases.take()
    assert second != first
    assert _contents(_with_database(pg_server_url, second)) == fresh
    with pytest.raises(psycopg.OperationalError):
        lingering.execute("SELECT 1")
    # Its URL reaches nothing any more: the name went with the test.
    with pytest.raises(OperationalError, match="does not exist"):
        create_engine(url).connect().close()
    databases.give_back(second)


def test_a_database_a_test_changed_the_schema_of_is_not_handed_out_again(
    pg_server_url: str, template_database: str, databases: _Databases, admin_engine: Engine
) -> None:
    fresh = _contents(_with_database(pg_server_url, template_database))
    first = databases.take()
    engine = create_engine(_with_database(pg_server_url, first))
    with engine.begin() as conn:
        oid = conn.execute(text("SELECT oid FROM pg_database WHERE datname = current_database()"))
        oid = oid.scalar_one()
        conn.execute(text("DROP INDEX scraping.ix_jobs_running_domain"))
    engine.dispose()
    databases.give_back(first)
    second = databases.take()
    with admin_engine.connect() as conn:
        oids = conn.execute(text("SELECT datname, oid FROM pg_database")).all()
    assert oid not in {o for _, o in oids}, "the changed database should be dropped"
    url = _with_database(pg_server_url, second)
    assert _contents(url) == fresh
    with create_engine(url).connect() as conn:
        assert conn.execute(
            text("SELECT to_regclass('scraping.ix_jobs_running_domain') IS NOT NULL")
        ).scalar_one()
    databases.give_back(second)
