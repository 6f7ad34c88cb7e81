"""Fixtures: every test gets a database of its own as the migrations left it, cloned from a
template or emptied after the test before (`_Databases`).

PIN_DATABASE_URL (a server the tests may create databases on) selects the PostgreSQL to
use; without it the session starts an embedded PostgreSQL in a temporary directory, so
the suite also runs on a machine that has only Python.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.pool import NullPool

from pin_orchestration.migrations import upgrade_database
from pin_orchestration.platform.db import create_db_engine


def pytest_configure(config: pytest.Config) -> None:
    """Give the stop signals back their defaults. A suite started in the background
    (`nohup … &`) inherits SIGHUP, SIGINT and SIGQUIT ignored, an ignored disposition
    survives exec, and every process a test starts would inherit it: a `sleep` that
    ignores the SIGTERM meant to stop it, a `pin metrics serve` deaf to SIGINT."""
    for stop_signal in (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM):
        if signal.getsignal(stop_signal) == signal.SIG_IGN:
            signal.signal(stop_signal, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The tests of minutes each (`--durations` on a quiet machine), longest first. Each is a
# unit of work of its own, handed out first: `--dist loadfile` gives a worker two units to
# start with, so the longest goes with the fourth, the second with the fifth, and no worker
# is left with one of them at the end (its default reordering by test count, off in
# pyproject.toml, put these files last, where they ran alone for the suite's last minutes;
# kept in one unit, the quick fault suite and `pin up`'s tests were one worker's ten minutes).
MINUTES_LONG_TESTS = (
    "tests/test_devstack.py::test_pin_up_serves_the_ui_runs_a_materialization_and_stops_cleanly",
    "tests/faults/test_quick_suite.py::"
    "test_pin_faults_run_quick_passes_with_every_invariant_holding[scraping]",
    "tests/test_devstack.py::"
    "test_pin_up_on_the_embedded_database_stops_everything_it_started[sigint_to_pin_up]",
    "tests/test_devstack.py::"
    "test_pin_up_on_the_embedded_database_stops_everything_it_started[ctrl_c_to_the_group]",
    "tests/faults/test_quick_suite.py::"
    "test_pin_faults_run_quick_passes_with_every_invariant_holding[detach+locks]",
    "tests/faults/test_quick_suite.py::"
    "test_pin_faults_run_quick_passes_with_every_invariant_holding[recalc+reconcile]",
)
# Then the files of about a minute each, so no worker is left with one at the end.
MINUTE_LONG_FILES = (
    "tests/news_reconcile/test_guards.py",
    "tests/faults/test_recalc_faults.py",
    "tests/faults/test_scraping_faults.py",
    "tests/faults/test_locks_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(MINUTES_LONG_TESTS + MINUTE_LONG_FILES)}
    items.sort(
        key=lambda item: rank.get(item.nodeid, rank.get(item.nodeid.split("::")[0], len(rank)))
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class MinutesLongTestsOnTheirOwn(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid in MINUTES_LONG_TESTS else super()._split_scope(nodeid)

    return MinutesLongTestsOnTheirOwn(config, log)


# Checks every event a test publishes against contracts/events (issue 12); fails the
# session naming any process it started that is still alive at its end (issue 20).
pytest_plugins = ("tests.contracts.plugin", "tests.leftover_processes")


@pytest.fixture(autouse=True)
def _no_dagster_defs_state_storage_from_an_earlier_test() -> None:
    """Dagster keeps the current defs-state storage in a context variable that an instance
    sets; a test that leaves it set hands the next test in the same worker a storage whose
    instance is gone, and building definitions there fails ("Attempted to resolve
    undefined DagsterInstance weakref"). Each test starts without one."""
    from dagster._core.storage.defs_state.base import _current_storage

    _current_storage.set(None)


@contextmanager
def embedded_data_dir() -> Iterator[Path]:
    """A scratch directory for an embedded PostgreSQL, outside pytest's tmp tree.

    As root, pgserver runs the server as its own user and opens the parent folders to it;
    pytest makes its /tmp/pytest-of-<user> private again whenever any session starts, which
    would pull the data directory out from under a running server.
    """
    path = Path(tempfile.mkdtemp(prefix="pin-embedded-pg-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A URL on a server where tests may create databases."""
    configured = os.environ.get("PIN_DATABASE_URL")
    if configured:
        yield configured
        return
    from pin_orchestration.platform.embedded import start_embedded_postgres, stop_embedded_postgres

    with embedded_data_dir() as data_dir:
        url = start_embedded_postgres(data_dir, stop_on_exit=True)
        # A scratch server, deleted with the session: what a crash would lose does not
        # matter, and the suite's CPU is the bound (a commit waits for no disk; autovacuum
        # off, as on the CI machine's server, so a test's database is emptied, not cloned
        # again after an autoanalyze).
        admin = create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as conn:
            for setting in ("fsync", "synchronous_commit", "full_page_writes", "autovacuum"):
                conn.execute(text(f"ALTER SYSTEM SET {setting} = off"))
            conn.execute(text("SELECT pg_reload_conf()"))
        admin.dispose()
        yield url
        # Stop it before its data directory goes away.
        stop_embedded_postgres(data_dir)


@pytest.fixture(scope="session")
def admin_engine(pg_server_url: str) -> Iterator[Engine]:
    engine = create_engine(pg_server_url, isolation_level="AUTOCOMMIT", pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def template_database(pg_server_url: str, admin_engine: Engine) -> Iterator[str]:
    """A database migrated to head once per session; tests clone it (CREATE … TEMPLATE)."""
    name = f"pin_tpl_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    upgrade_database(_with_database(pg_server_url, name))
    yield name
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


# Catalogs a test's DDL writes to (a table, index, function, trigger, type, schema, a
# temporary object's schema, a collation, a foreign-data wrapper…). Their row count and
# newest xmin, equal to the template's after a test, say it made no DDL.
_CATALOGS = (
    "pg_class", "pg_attribute", "pg_attrdef", "pg_constraint", "pg_index", "pg_proc",
    "pg_namespace", "pg_type", "pg_trigger", "pg_rewrite", "pg_depend", "pg_description",
    "pg_sequence", "pg_policy", "pg_extension", "pg_inherits", "pg_enum", "pg_event_trigger",
    "pg_operator", "pg_opclass", "pg_opfamily", "pg_amop", "pg_amproc", "pg_am", "pg_cast",
    "pg_aggregate", "pg_collation", "pg_conversion", "pg_transform", "pg_ts_config",
    "pg_ts_config_map", "pg_ts_dict", "pg_ts_parser", "pg_ts_template", "pg_language",
    "pg_foreign_data_wrapper", "pg_foreign_server", "pg_foreign_table", "pg_user_mapping",
    "pg_publication", "pg_publication_rel", "pg_default_acl", "pg_init_privs",
    "pg_largeobject_metadata", "pg_statistic_ext", "pg_seclabel", "pg_statistic",
)  # fmt: skip
# What else makes a database unlike a fresh clone, in the same SELECT: the database's own
# row and its comment, labels and settings (shared catalogs), prepared transactions; and a
# table a test vacuumed or analyzed (pg_class updated in place: its xmin stays) or grew
# to 10 pages or more, whose size the planner would read where it reads a fresh table as
# 10 pages (a never-vacuumed table under 10 pages is planned as 10).
_CATALOG_FINGERPRINT = text(
    "SELECT "
    + ", ".join(f"(SELECT count(*) || '/' || max(xmin::text::bigint) FROM {c})" for c in _CATALOGS)
    + ", (SELECT row(d.datconnlimit, d.datistemplate, d.datallowconn, d.datacl::text,"
    "            shobj_description(d.oid, 'pg_database'))::text"
    "     FROM pg_database d WHERE d.datname = current_database())"
    ", (SELECT count(*) FROM pg_shseclabel l JOIN pg_database d ON d.oid = l.objoid"
    "    WHERE d.datname = current_database())"
    ", (SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase"
    "    WHERE d.datname = current_database())"
    ", (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())"
    ", (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    "    WHERE c.relkind IN ('r', 'i', 't', 'S', 'm') AND n.nspname NOT LIKE 'pg\\_%'"
    "      AND n.nspname <> 'information_schema'"
    "      AND (c.reltuples >= 0 OR pg_relation_size(c.oid) >= 10 * 8192))"
)
_USER_TABLES = text(
    "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables"
    " WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
)
_SEQUENCES = text(
    "SELECT format('%I.%I', schemaname, sequencename), start_value FROM pg_sequences"
    " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
)


class _NotAsMigrated(Exception):
    """A database a test had is not as the migrations left it, or cannot be made so."""


class _Databases:
    """This worker's test databases. The first is cloned from the template; when a test is
    done with one, a thread of its own readies it for the next: every session on it is
    ended, it is renamed (so nothing left of the test, a thread or a child still holding
    its URL, reaches the next test), and, when the test made no DDL (nor analyzed, vacuumed
    or grew a table to 10 pages, nor changed the database's own row: `_CATALOG_FINGERPRINT`
    equal to the template's), emptied, given the rows the migrations wrote and its
    statistics reset; otherwise it is dropped and a new clone taken. A clone and its drop
    cost the server ~170 ms of CPU (CREATE DATABASE writes the template's pages to the WAL
    and forces its commit to disk), an emptying ~5 ms: the suite is CPU-bound, and most of
    its tests take a database (581-600 s against 640-665 s for the whole suite on the
    2-core machine)."""

    def __init__(self, server_url: str, admin_engine: Engine, template: str) -> None:
        self._server_url = server_url
        self._admin = admin_engine
        self._template = template
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="pin-test-databases")
        self._next: Future[str] | None = None
        self.handed_out: list[str] = []  # names, as taken (for a test of this class)
        with self._connect(template) as conn:
            self._fingerprint = tuple(conn.execute(_CATALOG_FINGERPRINT).one())
            self._tables = list(conn.execute(_USER_TABLES).scalars())
            self._sequences = [tuple(r) for r in conn.execute(_SEQUENCES)]
            self._seeded = {t: rows for t in self._tables if (rows := _copy_out(conn, t))}

    def __enter__(self) -> _Databases:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _connect(self, database: str) -> Iterator[Connection]:
        engine = create_engine(_with_database(self._server_url, database), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            engine.dispose()

    def _clone(self) -> str:
        name = f"pin_t_{uuid.uuid4().hex[:12]}"
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"'))
        return name

    def _drop(self, name: str) -> None:
        with self._admin.connect() as conn:
            try:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            except ProgrammingError:  # 42809: a test made it a template
                conn.execute(text(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false'))
                conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))

    def _renamed_alone(self, name: str) -> str | None:
        """`name` under a new name once every session on it has ended; None when sessions
        keep coming back (a child of the test still running): then it is for dropping."""
        renamed = f"pin_t_{uuid.uuid4().hex[:12]}"
        # A bound on the time, not the tries: a RENAME itself waits up to 5 s for sessions.
        deadline = time.monotonic() + 10
        with self._admin.connect() as conn:
            while time.monotonic() < deadline:
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": name},
                )
                try:
                    conn.execute(text(f'ALTER DATABASE "{name}" RENAME TO "{renamed}"'))
                    return renamed
                except OperationalError:  # 55006: a terminated session has not exited yet
                    time.sleep(0.01)
        return None

    def _recycle(self, name: str) -> str:
        renamed = None
        try:
            renamed = self._renamed_alone(name)
            if renamed is None:
                raise _NotAsMigrated(f"sessions kept coming back to {name}")
            self._empty(renamed)
            return renamed
        except Exception:  # noqa: BLE001 - whatever it was, a new clone is always right
            for leftover in {name, renamed} - {None}:
                self._drop(leftover)
            return self._clone()

    def _empty(self, name: str) -> None:
        with self._connect(name) as conn:
            if tuple(conn.execute(_CATALOG_FINGERPRINT).one()) != self._fingerprint:
                raise _NotAsMigrated(f"{name}: its schema changed")
            # Foreign keys and triggers off: every table is emptied, in any order.
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            for table in self._tables:
                conn.execute(text(f"DELETE FROM {table}"))
            for table, rows in self._seeded.items():
                _copy_in(conn, table, rows)
            for sequence, start in self._sequences:
                conn.execute(text("SELECT setval(:s, :v, false)"), {"s": sequence, "v": start})
            conn.commit()
            # The counts in pg_stat_user_tables and pg_stat_database go too, this
            # emptying's own DELETEs included: flushed (as the session idles) before the reset.
            conn.execute(text("SELECT pg_stat_force_next_flush()"))
            conn.commit()
            conn.execute(text("SELECT pg_stat_reset()"))
            conn.commit()

    def take(self) -> str:
        ready = self._next or self._thread.submit(self._clone)
        self._next = None
        self.handed_out.append(ready.result())
        return self.handed_out[-1]

    def give_back(self, name: str) -> None:
        self._next = self._thread.submit(self._recycle, name)

    def close(self) -> None:
        if self._next is not None:
            self._drop(self._next.result())
        self._thread.shutdown(wait=True)


def _copy_out(conn: Connection, table: str) -> bytes:
    driver = conn.connection.driver_connection
    with driver.cursor() as cur, cur.copy(f"COPY {table} TO STDOUT") as copy:  # type: ignore[union-attr]
        return b"".join(bytes(chunk) for chunk in copy)


def _copy_in(conn: Connection, table: str, rows: bytes) -> None:
    driver = conn.connection.driver_connection
    with driver.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN") as copy:  # type: ignore[union-attr]
        copy.write(rows)


@pytest.fixture(scope="session")
def _databases(
    pg_server_url: str, admin_engine: Engine, template_database: str
) -> Iterator[_Databases]:
    with _Databases(pg_server_url, admin_engine, template_database) as databases:
        yield databases


@pytest.fixture
def db_url(pg_server_url: str, _databases: _Databases) -> Iterator[str]:
    """URL of a database for this test alone, as every migration left it."""
    name = _databases.take()
    url = _with_database(pg_server_url, name)
    yield url
    create_db_engine(url).dispose()
    _databases.give_back(name)


@pytest.fixture
def db_engine(db_url: str) -> Engine:
    return create_db_engine(db_url)


@pytest.fixture
def empty_db_url(pg_server_url: str, admin_engine: Engine) -> Iterator[str]:
    """URL of a new database with nothing in it (for migration and CLI tests)."""
    name = f"pin_e_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield _with_database(pg_server_url, name)
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3 HTTP endpoint on loopback (moto's server), with test credentials."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        # boto3 must find these and never look further (no profile files, no instance
        # metadata service off the machine).
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        missing = tmp_path_factory.mktemp("aws") / "none"
        env.setenv("AWS_CONFIG_FILE", str(missing))
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(missing))
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
