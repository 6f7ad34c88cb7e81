"""Two FullSweeps at once (issue 29): one holds the lock and walks, the other is skipped on
it and owes a whole pass. The pass the skipped run owes starts after its skip; the one in
flight visited its first posts before, so it cannot stand in for it."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from pin_orchestration.areas import metrics_registry
from pin_orchestration.news import reconcile as reconcile_module
from pin_orchestration.news.reconcile import (
    ReconcileOptions,
    RunStatus,
    Scope,
    read_backlog,
    run_reconcile,
)
from tests.news_reconcile.factories import add_comments, add_post, comments_count

SWEEP = ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=1)


class PauseAfterFirstSlice(logging.LoggerAdapter[logging.Logger]):
    """The running sweep's logger: after its first slice of batches (committed, the lock
    still held) it tells the test and waits for it — a gate, not a sleep."""

    def __init__(self, paused: threading.Event, resume: threading.Event) -> None:
        super().__init__(logging.getLogger(__name__), {})
        self.paused, self.resume = paused, resume

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        super().info(msg, *args, **kwargs)
        if "batches processed" in str(msg) and not self.paused.is_set():
            self.paused.set()
            assert self.resume.wait(30), "the test never let the sweep go on"


def test_a_full_sweep_skipped_behind_a_running_one_stays_owed(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    posts = sorted(add_post(db_engine) for _ in range(4))
    monkeypatch.setattr(reconcile_module, "SLICE_SECONDS", 0.0)  # one batch a slice
    paused, resume = threading.Event(), threading.Event()
    results: list[Any] = []

    def running_sweep() -> None:
        results.append(
            run_reconcile(
                db_engine,
                SWEEP,
                run_id="running",
                holder="runner-a",
                logger=PauseAfterFirstSlice(paused, resume),
            )
        )

    runner = threading.Thread(target=running_sweep)
    runner.start()
    try:
        assert paused.wait(30)
        # The first post is behind the running sweep's cursor now; it drifts, and then a
        # second FullSweep is due and finds the lock held.
        with db_engine.begin() as conn:
            conn.execute(
                text("UPDATE news.posts SET comments_count = 7 WHERE id = :id"),
                {"id": posts[0]},
            )
        skipped = run_reconcile(db_engine, SWEEP, run_id=f"skip-{uuid.uuid4()}", holder="b")
        assert skipped.status == RunStatus.SKIPPED
        assert skipped.backlog_remaining is True
    finally:
        resume.set()
        runner.join(60)
    assert results[0].status == RunStatus.SUCCEEDED
    assert comments_count(db_engine, posts[0]) == 7  # the running sweep was past it

    # The skipped run's pass is still owed: nothing since its skip has looked at posts[0].
    backlog = read_backlog(db_engine)
    assert Scope.FULL_SWEEP in backlog.pending_passes
    assert results[0].backlog_remaining is True

    owed = run_reconcile(db_engine, SWEEP, run_id="owed-pass", holder="runner-c")
    assert owed.status == RunStatus.SUCCEEDED
    assert comments_count(db_engine, posts[0]) == 0
    assert owed.backlog_remaining is False
    assert read_backlog(db_engine).pending_passes == ()


@pytest.mark.parametrize("gone", ["deleted", "archived"])
def test_an_owed_post_deleted_or_archived_is_owed_nothing_in_the_gauges(
    db_engine: Engine, gone: str
) -> None:
    """A skipped post is owed; deleted or archived before the next run, it is owed
    nothing (the next run forgives it): the owed count and backlog_remaining the
    operators read say so at once, not only after that run."""
    busy = add_post(db_engine, comments_count=3)
    with db_engine.connect() as hot_path:
        hot_path.execute(text("SELECT 1 FROM news.posts WHERE id = :id FOR UPDATE"), {"id": busy})
        first = run_reconcile(db_engine, SWEEP, run_id="first", holder="a")
        hot_path.rollback()
    assert (first.posts_skipped, first.owed_posts, first.backlog_remaining) == (1, 1, True)
    with db_engine.begin() as conn:
        if gone == "deleted":
            conn.execute(text("DELETE FROM news.posts WHERE id = :id"), {"id": busy})
        else:
            conn.execute(
                text("UPDATE news.posts SET status = 'Archived' WHERE id = :id"), {"id": busy}
            )
    assert read_backlog(db_engine).owed_posts == 0
    assert read_backlog(db_engine).remaining is False
    registry = metrics_registry(db_engine)
    assert registry.get_sample_value("news_comment_reconcile_owed_posts") == 0
    assert registry.get_sample_value("news_comment_reconcile_backlog_remaining") == 0


def test_a_day_run_twice_at_once_owes_exactly_what_the_running_one_passed(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one day at once: the second is skipped on the lock and owes the day's
    posts; the first, still walking, pays what it looks at after that and not what it
    passed before (a drift there is after its look)."""
    anchor = datetime(2026, 11, 29, 21, tzinfo=UTC)  # the end of 2026-11-29, Moscow
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(3))
    for post in posts:
        add_comments(db_engine, post, 1, at=anchor - timedelta(minutes=1))
    daily = ReconcileOptions(scope=Scope.DAILY_WINDOW, batch_size=1)
    monkeypatch.setattr(reconcile_module, "SLICE_SECONDS", 0.0)
    paused, resume = threading.Event(), threading.Event()
    results: list[Any] = []

    def running_day() -> None:
        results.append(
            run_reconcile(
                db_engine,
                daily,
                run_id="running",
                holder="runner-a",
                window_anchor=anchor,
                partition="2026-11-29",
                logger=PauseAfterFirstSlice(paused, resume),
            )
        )

    runner = threading.Thread(target=running_day)
    runner.start()
    try:
        assert paused.wait(30)
        with db_engine.begin() as conn:
            conn.execute(
                text("UPDATE news.posts SET comments_count = 5 WHERE id = ANY(:ids)"),
                {"ids": [posts[0], posts[2]]},
            )
        skipped = run_reconcile(
            db_engine,
            daily,
            run_id="skipped",
            holder="b",
            window_anchor=anchor,
            partition="2026-11-29",
        )
        assert skipped.status == RunStatus.SKIPPED
        assert skipped.owed_posts == 3
    finally:
        resume.set()
        runner.join(60)
    (running,) = results
    assert running.status == RunStatus.SUCCEEDED
    assert running.drift_corrected == 1  # posts[2], looked at after the drift
    assert [comments_count(db_engine, p) for p in posts] == [5, 1, 1]
    with db_engine.connect() as conn:
        owed = conn.execute(text("SELECT post_id FROM news.comment_reconcile_owed")).scalars()
        assert list(owed) == [posts[0]]
    assert (running.owed_posts, running.backlog_remaining) == (1, True)

    later = run_reconcile(
        db_engine,
        daily,
        run_id="later",
        holder="c",
        window_anchor=anchor + timedelta(days=1),
        partition="2026-11-30",
    )
    assert later.drift_corrected == 1
    assert comments_count(db_engine, posts[0]) == 1
    assert (later.owed_posts, later.backlog_remaining) == (0, False)
    assert (
        metrics_registry(db_engine).get_sample_value("news_comment_reconcile_drift_corrected_total")
        == 2
    )
