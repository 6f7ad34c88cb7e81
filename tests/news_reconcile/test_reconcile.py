"""news-comment-reconcile against the real PostgreSQL: the seed's test table (REC-10) and more."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, create_engine, text

from pin_orchestration.coordination.locks import list_locks, try_acquire_lock
from pin_orchestration.news import reconcile as reconcile_module
from pin_orchestration.news.reconcile import (
    RECONCILE_JOB,
    ReconcileConfigError,
    ReconcileOptions,
    RunStatus,
    Scope,
    read_checkpoint,
    run_reconcile,
)
from tests.news_reconcile.factories import add_comments, add_post, comments_count, days_ago

FULL = ReconcileOptions(scope=Scope.FULL_SWEEP)


def reconcile(engine: Engine, options: ReconcileOptions = FULL, **kwargs):
    return run_reconcile(engine, options, run_id="test-run", holder="test-holder", **kwargs)


def test_empty_batch_is_a_noop_success(db_engine: Engine) -> None:
    result = reconcile(db_engine)
    assert result.status == RunStatus.SUCCEEDED
    assert (result.drift_corrected, result.posts_reconciled, result.batches_processed) == (0, 0, 0)
    assert result.backlog_remaining is False


def test_all_counters_right_corrects_nothing(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=2)
    add_comments(db_engine, post, 2)
    result = reconcile(db_engine)
    assert (result.posts_reconciled, result.drift_corrected) == (1, 0)


def test_drift_5_to_3_is_corrected(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=5)
    add_comments(db_engine, post, 3)
    with db_engine.connect() as conn:
        before = conn.execute(
            text("SELECT status, title, updated_at FROM news.posts WHERE id = :id"), {"id": post}
        ).one()
    result = reconcile(db_engine)
    assert comments_count(db_engine, post) == 3
    assert result.drift_corrected == 1
    assert result.corrections == [{"post_id": str(post), "from": 5, "to": 3}]
    with db_engine.connect() as conn:
        after = conn.execute(
            text("SELECT status, title, updated_at FROM news.posts WHERE id = :id"), {"id": post}
        ).one()
    # Only the counter and its audit timestamp change.
    assert (after.status, after.title) == (before.status, before.title)
    assert after.updated_at > before.updated_at


def test_rerun_is_idempotent(db_engine: Engine) -> None:
    posts = [add_post(db_engine, comments_count=i) for i in range(5)]
    for post in posts:
        add_comments(db_engine, post, 2)
    first = reconcile(db_engine)
    assert first.drift_corrected == 4
    with db_engine.connect() as conn:
        stamps = conn.execute(text("SELECT id, updated_at FROM news.posts ORDER BY id")).all()
    second = reconcile(db_engine)
    assert second.drift_corrected == 0
    assert second.posts_reconciled == 5
    with db_engine.connect() as conn:
        assert (
            conn.execute(text("SELECT id, updated_at FROM news.posts ORDER BY id")).all() == stamps
        )
    assert all(comments_count(db_engine, p) == 2 for p in posts)


def test_hidden_and_deleted_comments_do_not_count(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=9)
    add_comments(db_engine, post, 2, status="Visible")
    add_comments(db_engine, post, 3, status="HiddenByModerator")
    add_comments(db_engine, post, 4, status="DeletedByAuthor")
    reconcile(db_engine)
    assert comments_count(db_engine, post) == 2


def test_post_without_comments_goes_to_zero(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=4)
    reconcile(db_engine)
    assert comments_count(db_engine, post) == 0


def test_archived_posts_are_left_alone(db_engine: Engine) -> None:
    archived = add_post(db_engine, comments_count=7, status="Archived")
    add_comments(db_engine, archived, 1)
    reconcile(db_engine)
    assert comments_count(db_engine, archived) == 7


def with_lock_timeout(engine: Engine, seconds: float) -> Engine:
    """An engine on the same database whose sessions give up waiting for a lock after
    `seconds`: a run that waits on a row lock fails with "lock timeout" instead of hanging
    the test into pytest's timeout."""
    return create_engine(
        engine.url, connect_args={"options": f"-c lock_timeout={int(seconds * 1000)}"}
    )


def wait_for_backend_waiting_on(engine: Engine, wait_event: str) -> None:
    """Until some session of this database waits on a lock of type `wait_event`: a gate
    on the server's own state, not on the clock. The bound only ends a broken run: a
    `pin news reconcile` starting on a loaded machine took over 30 s to reach its batch."""
    deadline = time.monotonic() + 120
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = :e"
    )
    while True:
        with engine.connect() as conn:
            if conn.execute(query, {"e": wait_event}).scalar_one():
                return
        assert time.monotonic() < deadline, f"no session waited on {wait_event}"
        time.sleep(0.01)


def test_post_locked_by_live_writer_is_skipped_not_waited_on(db_engine: Engine) -> None:
    busy = add_post(db_engine, comments_count=5)
    free = add_post(db_engine, comments_count=5)
    add_comments(db_engine, busy, 1)
    add_comments(db_engine, free, 1)
    # A hot-path inc/dec holds the row lock on a second connection while the job runs. A
    # run that waited for it would fail on its lock_timeout, not hang the test.
    bounded = with_lock_timeout(db_engine, 2)
    with db_engine.connect() as hot_path:
        hot_path.execute(
            text("UPDATE news.posts SET comments_count = comments_count + 1 WHERE id = :id"),
            {"id": busy},
        )
        result = reconcile(bounded)
        hot_path.commit()
    bounded.dispose()
    assert result.status == RunStatus.SUCCEEDED, f"the run waited on the live row: {result.error}"
    assert result.posts_reconciled == 1
    assert comments_count(db_engine, free) == 1
    # The hot-path update is not lost; the post is reconciled by the next run.
    assert comments_count(db_engine, busy) == 6
    reconcile(db_engine)
    assert comments_count(db_engine, busy) == 1


def gate_post_updates(engine: Engine, advisory_key: int) -> None:
    """Every update of a post waits for the advisory lock `advisory_key` (a gate the test
    holds), with the batch's row locks taken."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f"""
                CREATE FUNCTION news.gate() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN PERFORM pg_advisory_xact_lock({int(advisory_key)}); RETURN NEW; END $$;
                CREATE TRIGGER gate BEFORE UPDATE ON news.posts
                  FOR EACH ROW EXECUTE FUNCTION news.gate();
                """
            )
        )


def test_comment_insert_on_a_post_the_batch_holds_does_not_wait(db_engine: Engine) -> None:
    """The seed promises no locks on users' comments: while a batch holds a drifted post's
    row lock, a comment insert on that post (its foreign-key check takes FOR KEY SHARE on
    the post) goes through at once."""
    post = add_post(db_engine, comments_count=5)
    add_comments(db_engine, post, 1)
    # The batch pauses right after locking the post, before its update: it waits for an
    # advisory lock the test holds (a gate, not a sleep).
    gate_post_updates(db_engine, 4242)
    results = []
    with db_engine.connect() as gate:
        gate.execute(text("SELECT pg_advisory_lock(4242)"))
        worker = threading.Thread(target=lambda: results.append(reconcile(db_engine)))
        worker.start()
        try:
            wait_for_backend_waiting_on(db_engine, "advisory")
            commenter = with_lock_timeout(db_engine, 2)
            try:
                with commenter.begin() as conn:
                    conn.execute(
                        text(
                            "INSERT INTO news.comments (id, post_id, status) "
                            "VALUES (gen_random_uuid(), :p, 'Visible')"
                        ),
                        {"p": post},
                    )
            finally:
                commenter.dispose()
        finally:
            gate.execute(text("SELECT pg_advisory_unlock(4242)"))
            gate.commit()
            worker.join(30)
    assert results[0].status == RunStatus.SUCCEEDED
    # The batch counted before the insert; the next run counts the new comment.
    reconcile(db_engine)
    assert comments_count(db_engine, post) == 2


def test_locked_rows_do_not_end_the_sweep_early(db_engine: Engine) -> None:
    """A short batch caused by SKIP LOCKED is not the end of the data."""
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(6))
    bounded = with_lock_timeout(db_engine, 2)
    with db_engine.connect() as hot_path:
        hot_path.execute(
            text("SELECT 1 FROM news.posts WHERE id = :id FOR UPDATE"), {"id": posts[0]}
        )
        result = reconcile(bounded, ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=3))
        hot_path.rollback()
    bounded.dispose()
    assert result.status == RunStatus.SUCCEEDED, f"the run waited on the live row: {result.error}"
    assert result.posts_reconciled == 5
    assert all(comments_count(db_engine, p) == 0 for p in posts[1:])


def test_checkpoint_resume_after_max_run_duration(db_engine: Engine) -> None:
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(7))
    # Every batch runs past a tiny budget: one batch per run.
    options = ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=3, max_run_duration_seconds=1e-6)
    first = reconcile(db_engine, options)
    assert first.status == RunStatus.SUCCEEDED
    # The budget is checked after each batch, so every run makes progress.
    assert first.batches_processed == 1
    assert first.backlog_remaining is True
    assert first.last_post_id == posts[2]
    assert read_checkpoint(db_engine, Scope.FULL_SWEEP) == posts[2]
    assert [comments_count(db_engine, p) for p in posts] == [0, 0, 0, 1, 1, 1, 1]

    second = reconcile(db_engine, options)
    assert second.start_after_post_id == posts[2]
    assert second.posts_reconciled == 3
    assert [comments_count(db_engine, p) for p in posts] == [0, 0, 0, 0, 0, 0, 1]

    third = reconcile(db_engine, options)
    assert third.posts_reconciled == 1
    assert third.backlog_remaining is False
    # The sweep reached the end: the next run starts from the beginning again.
    assert read_checkpoint(db_engine, Scope.FULL_SWEEP) is None
    assert all(comments_count(db_engine, p) == 0 for p in posts)


def test_lock_contention_skips_without_work(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=5)
    assert try_acquire_lock(db_engine, RECONCILE_JOB.lock_key, 60, "other-pod")
    result = reconcile(db_engine)
    assert result.status == RunStatus.SKIPPED
    assert result.batches_processed == 0
    assert comments_count(db_engine, post) == 5
    with db_engine.connect() as conn:
        holder = conn.execute(
            text("SELECT holder FROM pin.distributed_locks WHERE lock_key = :k"),
            {"k": RECONCILE_JOB.lock_key},
        ).scalar_one()
    assert holder == "other-pod"


def test_expired_lock_is_taken_over(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=5)
    assert try_acquire_lock(db_engine, RECONCILE_JOB.lock_key, 60, "dead-pod")
    with db_engine.begin() as conn:
        conn.execute(
            text("UPDATE pin.distributed_locks SET expires_at = now() - interval '1 second'")
        )
    result = reconcile(db_engine)
    assert result.status == RunStatus.SUCCEEDED
    assert comments_count(db_engine, post) == 0


def test_cancellation_between_batches_keeps_committed_work(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(6))
    stop = threading.Event()
    # A stop is honoured between slices; a slice of 0 s is one batch.
    monkeypatch.setattr(reconcile_module, "SLICE_SECONDS", 0.0)

    class StopAfterFirstBatch:
        def info(self, msg: str, *args: object) -> None:
            if "batches processed" in msg:
                stop.set()

        def __getattr__(self, name: str):
            return lambda *a, **k: None

    result = reconcile(
        db_engine,
        ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2),
        stop_requested=stop,
        logger=StopAfterFirstBatch(),  # type: ignore[arg-type]
    )
    assert result.status == RunStatus.CANCELLED
    assert result.batches_processed == 1
    assert result.backlog_remaining is True
    assert [comments_count(db_engine, p) for p in posts] == [0, 0, 1, 1, 1, 1]
    assert read_checkpoint(db_engine, Scope.FULL_SWEEP) == posts[1]


def test_daily_window_only_takes_posts_with_recent_activity(db_engine: Engine) -> None:
    recent = add_post(db_engine, comments_count=9)
    add_comments(db_engine, recent, 1, at=days_ago(0.5))
    quiet = add_post(db_engine, comments_count=9)
    add_comments(db_engine, quiet, 1, at=days_ago(3))
    result = reconcile(db_engine, ReconcileOptions(scope=Scope.DAILY_WINDOW))
    assert result.posts_reconciled == 1
    assert comments_count(db_engine, recent) == 1
    assert comments_count(db_engine, quiet) == 9
    reconcile(db_engine)  # FullSweep reaches the quiet post
    assert comments_count(db_engine, quiet) == 1


def test_daily_window_sees_a_comment_hidden_recently(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=2)
    add_comments(db_engine, post, 2, at=days_ago(5))
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE news.comments SET status = 'HiddenByModerator', updated_at = now() "
                "WHERE id = (SELECT id FROM news.comments WHERE post_id = :p LIMIT 1)"
            ),
            {"p": post},
        )
    reconcile(db_engine, ReconcileOptions(scope=Scope.DAILY_WINDOW))
    assert comments_count(db_engine, post) == 1


def test_window_anchor_moves_the_window_for_backfills(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=9)
    add_comments(db_engine, post, 1, at=days_ago(10))
    result = reconcile(
        db_engine, ReconcileOptions(scope=Scope.DAILY_WINDOW), window_anchor=days_ago(9.5)
    )
    assert result.posts_reconciled == 1
    assert comments_count(db_engine, post) == 1


def test_failing_batch_keeps_earlier_batches_and_checkpoint(db_engine: Engine) -> None:
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(4))
    # The second batch fails: a trigger rejects the update of posts[3].
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
    result = reconcile(db_engine, ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2))
    assert result.status == RunStatus.FAILED
    assert "disk on fire" in (result.error or "")
    assert result.batches_processed == 1
    assert [comments_count(db_engine, p) for p in posts] == [0, 0, 1, 1]
    assert read_checkpoint(db_engine, Scope.FULL_SWEEP) == posts[1]
    with db_engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM pin.job_runs ORDER BY id DESC LIMIT 1")
        ).scalar_one()
    assert status == "failed"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (ReconcileOptions(batch_size=0), "batch_size"),
        (ReconcileOptions(max_run_duration_seconds=0), "max_run_duration_seconds"),
        (ReconcileOptions(window_lookback_hours=-1), "window_lookback_hours"),
        (ReconcileOptions(lock_ttl_seconds=0), "lock_ttl_seconds"),
        (ReconcileOptions(scope="Sometimes"), "scope"),  # type: ignore[arg-type]
    ],
)
def test_invalid_config_fails_before_any_work(
    db_engine: Engine, options: ReconcileOptions, field: str
) -> None:
    post = add_post(db_engine, comments_count=5)
    with pytest.raises(ReconcileConfigError, match=field):
        reconcile(db_engine, options)
    assert comments_count(db_engine, post) == 5
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pin.job_runs")).scalar_one() == 0


def test_full_sweep_window_lookback_is_not_required(db_engine: Engine) -> None:
    """FullSweep ignores the window: a lookback of 0 is valid for it and a post with no
    recent activity is still reconciled; the same lookback is refused for DailyWindow."""
    post = add_post(db_engine, comments_count=5)
    add_comments(db_engine, post, 2, at=days_ago(30))
    result = reconcile(db_engine, ReconcileOptions(scope=Scope.FULL_SWEEP, window_lookback_hours=0))
    assert (result.status, result.drift_corrected) == (RunStatus.SUCCEEDED, 1)
    assert comments_count(db_engine, post) == 2
    with pytest.raises(ReconcileConfigError, match="window_lookback_hours"):
        reconcile(db_engine, ReconcileOptions(scope=Scope.DAILY_WINDOW, window_lookback_hours=0))


def drift(engine: Engine, post: uuid.UUID, at: datetime) -> None:
    """A comment written at `at` whose increment the hot path lost: the counter is stale."""
    add_comments(engine, post, 1, at=at)


def test_backfill_window_is_bounded_above_by_the_end_of_its_day(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=0)
    drift(db_engine, post, days_ago(1 / 24))  # activity an hour ago, not on the backfilled day
    result = reconcile(
        db_engine, ReconcileOptions(scope=Scope.DAILY_WINDOW), window_anchor=days_ago(3)
    )
    assert result.posts_reconciled == 0
    assert comments_count(db_engine, post) == 0


def test_resumed_daily_window_wraps_around_with_the_cut_runs_window(db_engine: Engine) -> None:
    """Runs 1 and 2 are cut by MaxRunDuration (one batch each), run 3 completes. Activity
    since run 1's window started, on posts below the cursor and above it, is reconciled by
    run 3, although run 3's own 26 h window does not reach back that far."""
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(8))
    day1, day2, day3 = days_ago(2), days_ago(1), days_ago(0)
    for post in posts:
        add_comments(db_engine, post, 1, at=day1 - timedelta(hours=1))
    cut = ReconcileOptions(scope=Scope.DAILY_WINDOW, batch_size=2, max_run_duration_seconds=1e-6)
    first = reconcile(db_engine, cut, window_anchor=day1)
    assert first.last_post_id == posts[1]
    # After run 1 passed posts[0]: activity it could not see.
    drift(db_engine, posts[0], day1 + timedelta(hours=1))
    # Above the cursor, inside run 1's window but before run 2's and run 3's windows.
    drift(db_engine, posts[6], day1 - timedelta(hours=10))
    second = reconcile(db_engine, cut, window_anchor=day2)
    assert second.last_post_id == posts[3]
    # After run 2 passed posts[2].
    drift(db_engine, posts[2], day2 + timedelta(hours=1))
    third = reconcile(
        db_engine, ReconcileOptions(scope=Scope.DAILY_WINDOW, batch_size=2), window_anchor=day3
    )
    assert third.backlog_remaining is False
    assert {c["post_id"] for c in third.corrections} == {str(posts[i]) for i in (0, 2, 6)}
    assert [comments_count(db_engine, p) for p in posts] == [2, 1, 2, 1, 1, 1, 2, 1]
    # The circle closed: the next run starts a fresh pass with its own window.
    assert read_checkpoint(db_engine, Scope.DAILY_WINDOW) is None


def test_run_is_recorded_for_alerts(db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=5)
    reconcile(db_engine)
    with db_engine.connect() as conn:
        row = conn.execute(text("SELECT status, result FROM pin.job_runs")).one()
    assert row.status == "succeeded"
    assert row.result["drift_corrected"] == 1
    assert row.result["last_post_id"] == str(post)
    assert uuid.UUID(row.result["last_post_id"]) == post


GATE_KEY = 20_482


def gated_updates(engine: Engine) -> None:
    """Every update of a post waits at a gate (an advisory lock the test holds), so a run
    lasts exactly as long as the test keeps the gate shut."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f"""
                CREATE FUNCTION news.gate() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  PERFORM pg_advisory_lock_shared({GATE_KEY});
                  PERFORM pg_advisory_unlock_shared({GATE_KEY});
                  RETURN NEW;
                END $$;
                CREATE TRIGGER gate BEFORE UPDATE ON news.posts
                  FOR EACH ROW EXECUTE FUNCTION news.gate();
                """
            )
        )


@contextmanager
def a_run_held_at_the_gate(engine: Engine, options: ReconcileOptions) -> Iterator[list]:
    """A reconcile run in a thread, its first batch held at the gate (`gated_updates`)
    while the block runs; then the gate opens and the run ends. Yields the list its
    result goes into."""
    results: list = []
    with engine.connect() as gate:
        gate.execute(text("SELECT pg_advisory_lock(:k)"), {"k": GATE_KEY})
        worker = threading.Thread(target=lambda: results.append(reconcile(engine, options)))
        worker.start()
        try:
            wait_for_backend_waiting_on(engine, "advisory")  # the first batch, at the gate
            yield results
        finally:
            gate.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": GATE_KEY})
        worker.join(60)
    assert not worker.is_alive()


def test_lock_is_renewed_while_a_run_outlasts_its_ttl(db_engine: Engine) -> None:
    """The run is held mid-batch at a gate until its lock has been renewed past its first
    expiry; meanwhile a second runner never gets the lock, and the run then ends SUCCEEDED.
    The TTL (renewed every 2 s) is long enough that a starved machine cannot let it lapse
    between two renewals."""
    posts = [add_post(db_engine, comments_count=1) for _ in range(4)]
    gated_updates(db_engine)
    options = ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=1, lock_ttl_seconds=6)
    with a_run_held_at_the_gate(db_engine, options) as results:
        (first,) = list_locks(db_engine)
        deadline = time.monotonic() + 60
        while list_locks(db_engine)[0].expires_at < first.expires_at + timedelta(
            seconds=options.lock_ttl_seconds
        ):
            assert not try_acquire_lock(db_engine, RECONCILE_JOB.lock_key, 60, "second-runner"), (
                "a second runner took the lock while the first was working"
            )
            assert time.monotonic() < deadline, "the lock was not renewed past its first expiry"
            time.sleep(0.05)
    assert results[0].status == RunStatus.SUCCEEDED
    assert all(comments_count(db_engine, p) == 0 for p in posts)


def test_run_stops_at_once_when_its_lock_is_lost(db_engine: Engine) -> None:
    """The lock expires while a batch is held at a gate: the batch in flight finishes (it
    took its fence first), and the next one (or the renewal) finds the lock gone and ends
    the run, whatever the machine's speed: posts are left unreconciled."""
    posts = [add_post(db_engine, comments_count=1) for _ in range(200)]
    gated_updates(db_engine)
    options = ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=1, lock_ttl_seconds=1)
    # The lock lapses under the batch (a renewal that never came). A takeover would wait
    # for the batch's fence; an expiry does not.
    with a_run_held_at_the_gate(db_engine, options) as results, db_engine.begin() as conn:
        conn.execute(text("UPDATE pin.distributed_locks SET expires_at = now()"))
    assert try_acquire_lock(db_engine, RECONCILE_JOB.lock_key, 60, "second-runner")
    result = results[0]
    assert result.status == RunStatus.FAILED
    assert "lock" in (result.error or "")
    assert result.backlog_remaining is True
    assert sum(comments_count(db_engine, p) for p in posts) > 0


class _LeaseLostSignal(logging.Handler):
    """Sets `lost` when the lock module reports a lease lost (its renewal's verdict)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lost = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "lost by" in record.getMessage():
            self.lost.set()


def test_a_lock_lost_during_the_passs_last_slice_fails_the_run(db_engine: Engine) -> None:
    """The renewal finds the lock lapsed while the pass's only slice is held at the gate
    (its fence taken before, so its batch stands); the slice then reaches the pass's end,
    and the run still ends FAILED: another runner may hold the lock by then. (Found by the
    fault suite's reconcile-pg-hang: the run logged its lost lock and exited succeeded.)"""
    post = add_post(db_engine, comments_count=1)
    gated_updates(db_engine)
    # Renewed every second: the renewal, not a batch's fence, notices the lapse.
    options = ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=10, lock_ttl_seconds=3)
    signal = _LeaseLostSignal()
    locks_log = logging.getLogger("pin_orchestration.coordination.locks")
    locks_log.addHandler(signal)
    try:
        with a_run_held_at_the_gate(db_engine, options) as results:
            with db_engine.begin() as conn:
                conn.execute(text("UPDATE pin.distributed_locks SET expires_at = now()"))
            assert signal.lost.wait(60), "the renewal never found the lock lapsed"
    finally:
        locks_log.removeHandler(signal)
    result = results[0]
    assert result.status == RunStatus.FAILED, result
    assert "lost the lock" in (result.error or "")
    assert result.batches_processed == 1
    assert comments_count(db_engine, post) == 0  # the held batch's correction stands


def test_a_batch_after_a_takeover_changes_nothing_and_stops_the_run(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fence: the renewal has not noticed yet (a long TTL), but another runner took the
    lock over between two slices; the next batch changes neither counters nor checkpoint,
    and the run stops FAILED."""
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(4))
    monkeypatch.setattr(reconcile_module, "SLICE_SECONDS", 0.0)  # a slice is one batch

    class TakeOverAfterFirstBatch:
        def info(self, msg: str, *args: object) -> None:
            if "batches processed" in msg:
                with db_engine.begin() as conn:
                    conn.execute(
                        text("UPDATE pin.distributed_locks SET expires_at = now() - interval '1s'")
                    )
                assert try_acquire_lock(db_engine, RECONCILE_JOB.lock_key, 60, "second-runner")

        def __getattr__(self, name: str):
            return lambda *a, **k: None

    result = reconcile(
        db_engine,
        ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2),
        logger=TakeOverAfterFirstBatch(),  # type: ignore[arg-type]
    )
    assert result.status == RunStatus.FAILED
    assert "lost the lock" in (result.error or "")
    assert result.batches_processed == 1
    assert [comments_count(db_engine, p) for p in posts] == [0, 0, 1, 1]
    assert read_checkpoint(db_engine, Scope.FULL_SWEEP) == posts[1]


def test_a_killed_runs_server_side_loop_stops_mid_slice(db_url: str, db_engine: Engine) -> None:
    """Cause of the reconcile-sigkill stall: a SIGKILLed `pin news reconcile` left its
    server-side slice running, and its batches went on committing after the kill. Its
    session now notices the client is gone even inside a batch, and ends without it."""
    post = add_post(db_engine, comments_count=5)
    gate_post_updates(db_engine, 4343)
    env = {**os.environ, "PIN_DATABASE_URL": db_url}
    with db_engine.connect() as gate:
        gate.execute(text("SELECT pg_advisory_lock(4343)"))
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pin_orchestration.cli",
                "news",
                "reconcile",
                "--scope=FullSweep",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_backend_waiting_on(db_engine, "advisory")
        finally:
            run.kill()
            run.wait()
        # The gate is still closed: only the dead client can end the batch.
        deadline = time.monotonic() + 30
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event = 'advisory'"
        )
        while True:
            with db_engine.connect() as conn:
                if not conn.execute(waiting).scalar_one():
                    break
            assert time.monotonic() < deadline, "the killed run's batch is still running"
            time.sleep(0.05)
        gate.execute(text("SELECT pg_advisory_unlock(4343)"))
        gate.commit()
    assert comments_count(db_engine, post) == 5
    # No batch committed: the pass the run began is still owed from its first post.
    assert read_checkpoint(db_engine, Scope.FULL_SWEEP) == reconcile_module.START_CURSOR
