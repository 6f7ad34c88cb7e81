"""Fixtures: every test gets a fresh, migrated database, cloned from a template.

PIN_DATABASE_URL (a server the tests may create databases on) selects the PostgreSQL to
use; without it the session starts an embedded PostgreSQL in a temporary directory, so
the suite also runs on a machine that has only Python.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

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
        yield start_embedded_postgres(data_dir, stop_on_exit=True)
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


@pytest.fixture
def db_url(pg_server_url: str, admin_engine: Engine, template_database: str) -> Iterator[str]:
    """URL of a fresh database for this test, with every migration applied."""
    name = f"pin_t_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"'))
    url = _with_database(pg_server_url, name)
    yield url
    create_db_engine(url).dispose()
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


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
