"""The test databases the suite hands out (tests/conftest.py `_Databases`): a database a test
gave back and the next one takes is as every migration left it, and nothing of the test
that had it reaches it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from pin_orchestration.migrations.schema_dump import libpq_url
from tests.conftest import _USER_TABLES, _Databases, _with_database


@pytest.fixture
def databases(
    pg_server_url: str, admin_engine: Engine, template_database: str
) -> Iterator[_Databases]:
    with _Databases(pg_server_url, admin_engine, template_database) as databases:
        yield databases
    # A test that failed before giving its database back leaves none behind either.
    for name in databases.handed_out:
        databases._drop(name)


def _contents(url: str) -> dict[str, object]:
    """Every user table's rows and every sequence's state."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            tables = conn.execute(_USER_TABLES).scalars()
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
    lingering = psycopg.connect(libpq_url(url), autocommit=True)
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


def _one(url: str, query: str) -> tuple[object, ...]:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute(query).fetchone()
        assert row is not None
        return tuple(row)


# What a test may leave behind (found by a hostile review), and a probe of it: each is
# either emptied away or makes the next test's database a new clone.
LEFT_BEHIND = {
    "analyze": (
        "INSERT INTO news.snapshot_detach_outbox (id, snapshot_id, post_id, reason)"
        " SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'BlockReplaced'"
        " FROM generate_series(1, 5000);"
        " ANALYZE news.snapshot_detach_outbox",
        "SELECT (SELECT count(*) FROM pg_stats WHERE tablename = 'snapshot_detach_outbox'),"
        " (SELECT reltuples FROM pg_class WHERE oid = 'news.snapshot_detach_outbox'::regclass)",
    ),
    "counts": (
        "INSERT INTO pin.job_runs (job_code, run_id, status, started_at)"
        " SELECT 'x', 'r' || n, 'succeeded', now() FROM generate_series(1, 300) n",
        "SELECT n_tup_ins, n_tup_del, n_dead_tup FROM pg_stat_user_tables"
        " WHERE relid = 'pin.job_runs'::regclass",
    ),
    "database": (
        "DO $$BEGIN EXECUTE format('COMMENT ON DATABASE %I IS ''x''; ALTER DATABASE %I"
        " CONNECTION LIMIT 7', current_database(), current_database()); END$$",
        "SELECT shobj_description(oid, 'pg_database'), datconnlimit FROM pg_database"
        " WHERE datname = current_database()",
    ),
    "fdw": (
        "CREATE FOREIGN DATA WRAPPER pin_test_fdw",
        "SELECT count(*) FROM pg_foreign_data_wrapper",
    ),
    "collation": (
        'CREATE COLLATION pg_catalog.pin_test_c FROM "C"',
        "SELECT count(*) FROM pg_collation WHERE collname = 'pin_test_c'",
    ),
    "text_search": (
        "CREATE TEXT SEARCH DICTIONARY pg_catalog.pin_test_d (TEMPLATE = simple)",
        "SELECT count(*) FROM pg_ts_dict WHERE dictname = 'pin_test_d'",
    ),
    "grant": (
        "GRANT SELECT ON pin.job_runs TO PUBLIC",
        "SELECT relacl::text FROM pg_class WHERE oid = 'pin.job_runs'::regclass",
    ),
    "sequence": (
        "ALTER SEQUENCE scraping.webhook_deliveries_id_seq INCREMENT 5",
        "SELECT increment_by FROM pg_sequences WHERE sequencename = 'webhook_deliveries_id_seq'",
    ),
    "setting": (
        "DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET work_mem = ''7MB''',"
        " current_database()); END$$",
        "SELECT current_setting('work_mem')",
    ),
    "large_object": ("SELECT lo_from_bytea(0, 'x')", "SELECT count(*) FROM pg_largeobject"),
    "temporary_table": (
        "CREATE TEMP TABLE pin_test_t (x int)",
        "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pg_temp%'",
    ),
    "advisory_lock": ("SELECT pg_advisory_lock(812012)", "SELECT pg_try_advisory_lock(812012)"),
}


@pytest.mark.parametrize("left", list(LEFT_BEHIND))
def test_nothing_a_test_leaves_in_its_database_reaches_the_next_test(
    pg_server_url: str, databases: _Databases, left: str
) -> None:
    done, probe = LEFT_BEHIND[left]
    first = databases.take()
    # Left open, as a thread or child of the test would leave it.
    lingering = psycopg.connect(libpq_url(_with_database(pg_server_url, first)), autocommit=True)
    lingering.execute(done)
    databases.give_back(first)
    second, fresh = databases.take(), databases._clone()
    try:
        assert _one(_with_database(pg_server_url, second), probe) == _one(
            _with_database(pg_server_url, fresh), probe
        )
    finally:
        lingering.close()
        databases._drop(fresh)
        databases.give_back(second)


@pytest.mark.parametrize(
    "statement",
    ['ALTER DATABASE "{name}" IS_TEMPLATE true', 'DROP DATABASE "{name}" WITH (FORCE)'],
    ids=["made-a-template", "dropped"],
)
def test_a_test_that_made_its_database_a_template_or_dropped_it_fails_no_later_test(
    pg_server_url: str, databases: _Databases, admin_engine: Engine, statement: str
) -> None:
    first = databases.take()
    with admin_engine.connect() as conn:
        conn.execute(text(statement.format(name=first)))
    databases.give_back(first)
    second = databases.take()
    with create_engine(_with_database(pg_server_url, second)).connect() as conn:
        assert not conn.execute(
            text("SELECT datistemplate FROM pg_database WHERE datname = current_database()")
        ).scalar_one()
    databases.give_back(second)
    with admin_engine.connect() as conn:  # nor is any left behind
        assert not conn.execute(
            text("SELECT count(*) FROM pg_database WHERE datistemplate AND datname LIKE 'pin_t_%'")
        ).scalar_one()
