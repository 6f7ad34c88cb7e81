"""The `pin` command line, run as an operator would: real subprocesses, real PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, text

from pin_orchestration.migrations import alembic_config, upgrade_database
from pin_orchestration.news.reconcile import SLICE_SECONDS, Scope, read_checkpoint
from pin_orchestration.platform.db import create_db_engine
from tests.conftest import embedded_data_dir
from tests.news_reconcile.factories import add_post

PIN = [sys.executable, "-m", "pin_orchestration.cli"]


def pin(
    *args: str,
    url: str | None,
    home: Path | None = None,
    python_args: Sequence[str] = (),
    **kwargs,
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PIN_DATABASE_URL"}
    if url is not None:
        env["PIN_DATABASE_URL"] = url
    if home is not None:
        env["PIN_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, *python_args, *PIN[1:], *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_db_upgrade_logs_one_line_per_migration(empty_db_url: str) -> None:
    """A first start applies every migration: one INFO line each (revision and the first
    line of its docstring), not alembic's paragraphs; an up-to-date database none."""
    revisions = {
        script.revision
        for script in ScriptDirectory.from_config(alembic_config(empty_db_url)).walk_revisions()
    }
    first = pin("db", "upgrade", url=empty_db_url)
    assert first.returncode == 0, first.stderr
    lines = [line for line in first.stderr.splitlines() if line.strip()]
    # Every line is a log record's own line: none continues a multi-line message.
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", line) for line in lines), (
        first.stderr
    )
    applied = [line for line in lines if "INFO pin_orchestration.migrations: applied" in line]
    assert {line.split("applied migration ")[1].split(":")[0] for line in applied} == revisions
    assert len(applied) == len(revisions) == len(lines), first.stderr
    second = pin("db", "upgrade", url=empty_db_url)
    assert second.returncode == 0, second.stderr
    assert "applied migration" not in second.stderr, second.stderr


def test_db_upgrade_creates_every_schema_and_is_repeatable(empty_db_url: str) -> None:
    first = pin("db", "upgrade", url=empty_db_url)
    assert first.returncode == 0, first.stderr
    second = pin("db", "upgrade", url=empty_db_url)
    assert second.returncode == 0, second.stderr
    engine = create_engine(empty_db_url)
    with engine.connect() as conn:
        tables = set(
            conn.execute(
                text(
                    "SELECT table_schema || '.' || table_name FROM information_schema.tables "
                    "WHERE table_schema IN ('news', 'pin')"
                )
            ).scalars()
        )
    engine.dispose()
    assert {
        "news.posts",
        "news.comments",
        "pin.distributed_locks",
        "pin.job_checkpoints",
        "pin.job_runs",
    } <= tables


def test_upstream_writer_knowing_only_spec_columns_can_insert(db_url: str) -> None:
    engine = create_db_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO news.posts (id, status, comments_count, updated_at) "
                "VALUES (gen_random_uuid(), 'Published', 0, now())"
            )
        )
        conn.execute(
            text(
                "INSERT INTO news.comments (id, post_id, status, created_at, updated_at) "
                "SELECT gen_random_uuid(), id, 'Visible', now(), now() FROM news.posts"
            )
        )


def test_demo_seed_is_idempotent_and_reconcile_fixes_its_drift(db_url: str) -> None:
    first = pin("demo", "seed", url=db_url)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["news"]["posts"] == 200
    second = pin("demo", "seed", url=db_url)
    assert json.loads(second.stdout)["news"] == {"posts": 0, "comments": 0}

    run = pin("news", "reconcile", "--scope", "FullSweep", url=db_url)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["status"] == "succeeded"
    assert summary["drift_corrected"] > 0
    again = json.loads(pin("news", "reconcile", "--scope", "FullSweep", url=db_url).stdout)
    assert again["drift_corrected"] == 0


def test_bad_config_is_refused_naming_the_field(db_url: str) -> None:
    run = pin("news", "reconcile", "--batch-size", "0", url=db_url)
    assert run.returncode == 2
    assert "batch_size must be > 0" in run.stderr


def test_bad_database_url_is_refused_naming_the_variable(tmp_path: Path) -> None:
    run = pin("demo", "seed", url="mysql://x@y/z", home=tmp_path)
    assert run.returncode == 1
    assert "PIN_DATABASE_URL must be a PostgreSQL SQLAlchemy URL" in run.stderr


def test_locks_list_and_release(db_url: str) -> None:
    from pin_orchestration.coordination.locks import try_acquire_lock

    assert try_acquire_lock(create_db_engine(db_url), "Pin:lock:x", 60, "host:1")
    listed = pin("locks", "list", url=db_url)
    assert "Pin:lock:x\thost:1\theld" in listed.stdout
    assert pin("locks", "release", "Pin:lock:x", url=db_url).returncode == 0
    assert pin("locks", "list", url=db_url).stdout == ""


def test_locks_release_takes_the_job_code_the_runbook_names(db_url: str) -> None:
    """docs/runbooks.md: `pin locks release news-comment-reconcile` — what an operator
    types is the job code, not the lock's full key."""
    from pin_orchestration.coordination.locks import try_acquire_lock
    from pin_orchestration.news.reconcile import RECONCILE_JOB

    assert try_acquire_lock(create_db_engine(db_url), RECONCILE_JOB.lock_key, 600, "stuck-pod")
    released = pin("locks", "release", "news-comment-reconcile", url=db_url)
    assert released.returncode == 0, released.stderr
    assert f"released {RECONCILE_JOB.lock_key}" in released.stdout
    assert pin("locks", "list", url=db_url).stdout == ""


def test_sigterm_stops_between_batches_keeping_committed_work(db_url: str) -> None:
    engine = create_db_engine(db_url)
    posts = sorted(add_post(engine, comments_count=1) for _ in range(20))
    # The gate: the first batch waits on news.comments until the test lets it go. It waits
    # longer than a slice, so the procedure returns after that batch and the stop request,
    # sent meanwhile, is seen before the next one, however fast the batches are.
    with engine.connect() as gate:
        gate.execute(text("LOCK TABLE news.comments IN ACCESS EXCLUSIVE MODE"))
        proc = subprocess.Popen(
            [*PIN, "news", "reconcile", "--scope", "FullSweep", "--batch-size", "1"],
            env={**os.environ, "PIN_DATABASE_URL": db_url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_for_a_batch_blocked_past_a_slice(engine, proc)
            proc.send_signal(signal.SIGTERM)
        finally:
            gate.rollback()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    summary = json.loads(out)
    assert summary["status"] == "cancelled"
    assert summary["backlog_remaining"] is True
    done = summary["batches_processed"]
    assert 0 < done < len(posts)
    checkpoint = read_checkpoint(engine, Scope.FULL_SWEEP)
    assert checkpoint == posts[done - 1]
    with engine.connect() as conn:
        counts = dict(conn.execute(text("SELECT id, comments_count FROM news.posts")).all())
    # Exactly the committed batches were corrected; nothing after the checkpoint.
    assert [counts[p] for p in posts] == [0] * done + [1] * (len(posts) - done)


def _wait_for_a_batch_blocked_past_a_slice(engine: Engine, proc: subprocess.Popen) -> None:
    blocked_past_a_slice = text(
        "SELECT count(*) FROM pg_locks WHERE relation = 'news.comments'::regclass "
        "AND NOT granted AND clock_timestamp() - waitstart > make_interval(secs => :slice)"
    )
    deadline = time.monotonic() + 60
    while True:
        with engine.connect() as conn:
            if conn.execute(blocked_past_a_slice, {"slice": SLICE_SECONDS}).scalar_one():
                return
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the reconcile's first batch never waited"
        time.sleep(0.05)


def test_fresh_machine_path_embedded_postgres() -> None:
    """No PIN_DATABASE_URL: the embedded PostgreSQL starts from scratch, is migrated, demo
    data loads and a reconcile corrects its drift — the path of a laptop with only Python."""
    with embedded_data_dir() as scratch:
        home = scratch / "pin-home"
        upgrade = pin("db", "upgrade", url=None, home=home)
        assert upgrade.returncode == 0, upgrade.stderr
        assert (home / "pgdata" / "PG_VERSION").exists()
        seeded = pin("demo", "seed", url=None, home=home)
        assert seeded.returncode == 0, seeded.stderr
        # pgserver's own INFO chatter (initdb, pg_ctl command lines) is not the operator's.
        for command in (upgrade, seeded):
            assert "INFO pgserver" not in command.stderr, command.stderr
        run = pin("news", "reconcile", "--scope", "FullSweep", url=None, home=home)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["drift_corrected"] > 0
        # State survives the restart of the server between commands.
        again = pin("news", "reconcile", "--scope", "FullSweep", url=None, home=home)
        assert json.loads(again.stdout)["drift_corrected"] == 0
        # Each command stopped the server it started: nothing is left running.
        assert not (home / "pgdata" / "postmaster.pid").exists()


def test_migrations_apply_on_a_fresh_database_in_process(empty_db_url: str) -> None:
    upgrade_database(empty_db_url)
    from pin_orchestration.migrations import current_revision

    engine = create_engine(empty_db_url)
    assert current_revision(engine) is not None
    engine.dispose()


def test_definitions_load_without_dagster_preview_warnings() -> None:
    """The preview/beta features used on purpose are acknowledged in one place, so code
    servers and `pin` commands do not repeat Dagster's warnings about them."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-W",
            "always",
            "-c",
            "from pin_orchestration.definitions import build_definitions; build_definitions()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    for warning in ("PreviewWarning", "BetaWarning", "SupersessionWarning"):
        assert warning not in loaded.stderr, loaded.stderr


def test_the_pin_command_line_loads_without_dagster() -> None:
    """`pin` is what operators, cron and the fault suite start many times an hour; Dagster's
    import alone costs about a second of CPU, which only `pin up` (and the code location
    it loads) needs. A command reaching for Dagster wiring (a resource, an asset) at import
    time puts that second on every `pin locks list`."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pin_orchestration.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster')[:5])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    assert loaded == "[]", f"importing pin_orchestration.cli loaded Dagster: {loaded}"
