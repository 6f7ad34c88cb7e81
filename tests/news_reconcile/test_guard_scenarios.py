"""The reconcile's guards, each shown by the scenario it exists for, on real PostgreSQL with
separate connections. test_guards.py runs these against a copy of the package with the
guard edited out (a broken build), where they fail naming what the guard protects.

Events are ordered by gates (a row lock the test holds, a trigger), never by sleeps."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

from pin_orchestration.news.reconcile import (
    RECONCILE_JOB,
    ReconcileOptions,
    ReconcileResult,
    RunStatus,
    Scope,
    read_checkpoint,
    run_reconcile,
)
from tests.news_reconcile.factories import add_comments, add_post, comments_count

FULL = ReconcileOptions(scope=Scope.FULL_SWEEP)


def reconcile(engine: Engine, options: ReconcileOptions = FULL, **kwargs: Any) -> ReconcileResult:
    return run_reconcile(engine, options, run_id="test-run", holder="test-holder", **kwargs)


def visible_comments(engine: Engine, post: uuid.UUID) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM news.comments WHERE post_id = :p AND status = 'Visible'"),
            {"p": post},
        ).scalar_one()


def wait_until_a_batch_is_blocked_by(engine: Engine, blocker_pid: int) -> None:
    """Until the run's sweep (its CALL; not, say, a lock renewal) waits on a lock the
    session `blocker_pid` holds: a gate on the server's own state, not on the clock."""
    deadline = time.monotonic() + 30
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE :pid = ANY(pg_blocking_pids(pid)) AND query LIKE 'CALL pg_temp.%'"
    )
    while True:
        with engine.connect() as conn:
            if conn.execute(query, {"pid": blocker_pid}).scalar_one():
                return
        assert time.monotonic() < deadline, "the run never reached its batch's fence"
        time.sleep(0.01)


class GateAfterLockTaken:
    """A run logger that, when the run logs that it started (it holds its lock, no batch
    has run), row-locks the run's lock row FOR UPDATE on its own connection: the run's
    first batch takes its statement snapshot and then waits at its fence (FOR KEY SHARE
    on that row), before it locks any post, until the gate's transaction ends."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.conn: Connection | None = None
        self.pid: int | None = None
        self.closed = threading.Event()
        self.armed = threading.Event()

    def info(self, msg: str, *args: object) -> None:
        if "started" in msg and self.conn is None:
            self.conn = self._engine.connect()
            self.pid = self.conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            locked = self.conn.execute(
                text("SELECT 1 FROM pin.distributed_locks WHERE lock_key = :k FOR UPDATE"),
                {"k": RECONCILE_JOB.lock_key},
            ).scalar()
            assert locked == 1, "the run logged 'started' without its lock row"
            self.armed.set()

    def open(self) -> None:
        """End the gate's transaction: the waiting batch goes on."""
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()

    def __getattr__(self, name: str):
        return lambda *a, **k: None


def test_a_hot_path_write_after_the_batchs_snapshot_is_not_overwritten(db_engine: Engine) -> None:
    """A drifted post whose row a hot-path writer changed (and committed) after the batch's
    snapshot is skipped: the batch's count, taken before that write, must not overwrite it
    (the write's increment would be lost until the next run)."""
    post = add_post(db_engine, comments_count=5)
    add_comments(db_engine, post, 3)
    gate = GateAfterLockTaken(db_engine)
    results: list[ReconcileResult] = []
    run = threading.Thread(target=lambda: results.append(reconcile(db_engine, logger=gate)))
    run.start()
    # The hot path must not wait for the batch (it holds no post yet): a wait fails on the
    # lock_timeout instead of hanging the test.
    hot_path = create_engine(db_engine.url, connect_args={"options": "-c lock_timeout=2000"})
    try:
        assert gate.armed.wait(30), "the run never logged that it started"
        assert gate.pid is not None
        wait_until_a_batch_is_blocked_by(db_engine, gate.pid)
        # The batch's snapshot is taken (3 Visible comments, counter 5): a user comments,
        # and the hot path increments the counter, committed before the batch locks.
        with hot_path.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO news.comments (id, post_id, status) "
                    "VALUES (gen_random_uuid(), :p, 'Visible')"
                ),
                {"p": post},
            )
            conn.execute(
                text("UPDATE news.posts SET comments_count = comments_count + 1 WHERE id = :p"),
                {"p": post},
            )
    finally:
        gate.open()
        hot_path.dispose()
        run.join(60)
    assert not run.is_alive(), "the run did not finish after the gate opened"
    assert results[0].status == RunStatus.SUCCEEDED, results[0].error
    counter, visible = comments_count(db_engine, post), visible_comments(db_engine, post)
    assert counter == 6, (
        f"the batch overwrote a hot-path write committed after its snapshot: counter "
        f"{counter}, {visible} Visible comments (a count taken before the write, one lost)"
    )
    # Skipped, not lost: the next run counts the new comment too.
    reconcile(db_engine)
    assert comments_count(db_engine, post) == visible == 4


def test_a_batch_that_fails_is_resumed_not_skipped(db_engine: Engine) -> None:
    """The checkpoint moves in the batch's own statement: a batch whose corrections roll
    back leaves the checkpoint before it, and the resumed run reconciles its posts."""
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(4))
    # The second batch (posts[2], posts[3]) fails on the server: a trigger rejects the
    # update of posts[3].
    with db_engine.begin() as conn:
        conn.execute(
            text(
                f"""
                CREATE FUNCTION news.reject() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF NEW.id = '{posts[3]}'::uuid THEN RAISE EXCEPTION 'disk on fire'; END IF;
                  RETURN NEW;
                END $$;
                CREATE TRIGGER reject BEFORE UPDATE ON news.posts
                  FOR EACH ROW EXECUTE FUNCTION news.reject();
                """
            )
        )
    options = ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2)
    failed = reconcile(db_engine, options)
    assert failed.status == RunStatus.FAILED
    assert "disk on fire" in (failed.error or "")
    with db_engine.begin() as conn:
        conn.execute(text("DROP TRIGGER reject ON news.posts"))
    resumed = reconcile(db_engine, options)
    assert resumed.status == RunStatus.SUCCEEDED, resumed.error
    left = [p for p in posts if comments_count(db_engine, p) != 0]
    assert not left, (
        f"the resumed run skipped the failed batch: {len(left)} drifted posts left "
        f"(it resumed after {resumed.start_after_post_id}, the failed batch ended at {posts[3]})"
    )
    assert read_checkpoint(db_engine, Scope.FULL_SWEEP) is None
