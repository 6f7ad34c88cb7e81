"""Nothing owed is forgotten, and every number read about the reconcile is derived from
durable, complete facts (issue 29): skipped posts and skipped days stay owed until a run
corrects them, the backlog gauge reads the durable state, and the analysts' values are
the runs' stored totals, whatever their status and whatever retention deleted."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dagster import DagsterInstance, materialize
from sqlalchemy import Engine, text

from pin_orchestration import analyst
from pin_orchestration.analyst import drift_by_post_status, reconcile_runs_frame
from pin_orchestration.areas import metrics_registry, retention_rules
from pin_orchestration.assets.news_reconcile import DRIFT_CHECK, post_comment_counts
from pin_orchestration.coordination.locks import try_acquire_lock
from pin_orchestration.coordination.retention import RetentionOptions, run_retention
from pin_orchestration.news import reconcile as reconcile_module
from pin_orchestration.news.reconcile import (
    RECONCILE_JOB,
    ReconcileOptions,
    RunStatus,
    Scope,
    run_reconcile,
)
from pin_orchestration.resources.database import DatabaseResource
from tests.news_reconcile.factories import add_comments, add_post, comments_count

OP = "news__post_comment_counts"
DAILY = ReconcileOptions(scope=Scope.DAILY_WINDOW)


def reconcile(engine: Engine, options: ReconcileOptions, **kwargs: Any):
    kwargs.setdefault("run_id", f"run-{uuid.uuid4().hex[:8]}")
    return run_reconcile(engine, options, holder="test-holder", **kwargs)


def metric(engine: Engine, name: str) -> float | None:
    return metrics_registry(engine).get_sample_value(name)


def test_a_post_skipped_as_locked_is_owed_to_the_next_days_run(db_engine: Engine) -> None:
    """Day 1's run skips a post a hot-path writer holds; day 2's window no longer holds
    that post's activity, yet day 2's run corrects it: the skip was owed, not forgotten."""
    day1 = datetime(2026, 11, 28, 21, tzinfo=UTC)
    busy = add_post(db_engine, comments_count=5)
    add_comments(db_engine, busy, 1, at=day1 - timedelta(hours=3))
    with db_engine.connect() as hot_path:
        hot_path.execute(text("SELECT 1 FROM news.posts WHERE id = :id FOR UPDATE"), {"id": busy})
        first = reconcile(db_engine, DAILY, window_anchor=day1, partition="2026-11-28")
        hot_path.rollback()
    assert first.status == RunStatus.SUCCEEDED
    assert first.posts_skipped == 1
    assert first.owed_posts == 1
    assert first.backlog_remaining is True
    assert metric(db_engine, "news_comment_reconcile_owed_posts") == 1
    assert metric(db_engine, "news_comment_reconcile_backlog_remaining") == 1
    with db_engine.connect() as conn:
        recorded = conn.execute(
            text("SELECT result FROM pin.job_runs ORDER BY id DESC LIMIT 1")
        ).scalar_one()
    assert (recorded["owed_posts"], recorded["backlog_remaining"]) == (1, True)

    second = reconcile(
        db_engine, DAILY, window_anchor=day1 + timedelta(days=1), partition="2026-11-29"
    )
    assert comments_count(db_engine, busy) == 1
    assert (second.drift_corrected, second.owed_posts, second.backlog_remaining) == (1, 0, False)
    assert metric(db_engine, "news_comment_reconcile_owed_posts") == 0
    assert metric(db_engine, "news_comment_reconcile_backlog_remaining") == 0


def run_asset(db_url: str, partition: str, config: dict[str, Any], **kwargs: Any):
    return materialize(
        [post_comment_counts],
        partition_key=partition,
        resources={"database": DatabaseResource(url=db_url)},
        run_config={"ops": {OP: {"config": config}}},
        instance=kwargs.pop("instance", None) or DagsterInstance.ephemeral(),
        **kwargs,
    )


def test_a_day_skipped_on_a_held_lock_fails_its_check_and_is_owed(
    db_url: str, db_engine: Engine
) -> None:
    post = add_post(db_engine, comments_count=5)
    add_comments(db_engine, post, 2, at=datetime(2026, 11, 20, 12, tzinfo=UTC))
    assert try_acquire_lock(db_engine, RECONCILE_JOB.lock_key, 600, "other-pod")
    skipped = run_asset(db_url, "2026-11-20", {"scope": "DailyWindow"})
    assert skipped.success  # the seed: a held lock is no failure of the run
    assert skipped.asset_materializations_for_node(OP) == []
    (check,) = skipped.get_asset_check_evaluations()
    assert check.check_name == DRIFT_CHECK
    assert not check.passed
    assert "skipped: lock held by other-pod" in (check.description or "")
    assert check.metadata["owed_posts"].value == 1
    assert comments_count(db_engine, post) == 5

    with db_engine.begin() as conn:
        conn.execute(text("DELETE FROM pin.distributed_locks"))
    # A later day's run, whose window holds nothing of 2026-11-20, corrects it.
    later = run_asset(db_url, "2026-11-29", {"scope": "DailyWindow"})
    (mat,) = later.asset_materializations_for_node(OP)
    assert mat.metadata["owed_posts"].value == 0
    assert mat.metadata["drift_corrected"].value == 1
    assert comments_count(db_engine, post) == 2


def test_the_drift_frame_counts_every_correction_not_a_sample(db_engine: Engine) -> None:
    posts = [add_post(db_engine, comments_count=3) for _ in range(120)]
    for post in posts[:7]:
        add_comments(db_engine, post, 1)
    result = reconcile(db_engine, ReconcileOptions(scope=Scope.FULL_SWEEP), partition="2026-11-29")
    assert result.drift_corrected == 120
    runs = reconcile_runs_frame(db_engine, "2026-11-29")
    frame = drift_by_post_status(db_engine, runs, "2026-11-29")
    assert frame.to_dict("records") == [
        {"post_status": "Published", "posts_corrected": 120, "comments_count_change": -353}
    ]


def test_a_cancelled_runs_corrections_count_for_analysts_and_prometheus(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(6):
        add_post(db_engine, comments_count=1)
    monkeypatch.setattr(reconcile_module, "SLICE_SECONDS", 0.0)
    stop = reconcile_module.threading.Event()

    class StopAfterFirstBatch:
        def info(self, msg: str, *args: object) -> None:
            if "batches processed" in msg:
                stop.set()

        def __getattr__(self, name: str):
            return lambda *a, **k: None

    cancelled = reconcile(
        db_engine,
        ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2),
        partition="2026-11-29",
        stop_requested=stop,
        logger=StopAfterFirstBatch(),  # type: ignore[arg-type]
    )
    assert (cancelled.status, cancelled.drift_corrected) == (RunStatus.CANCELLED, 2)
    runs = reconcile_runs_frame(db_engine, "2026-11-29")
    assert list(runs["status"]) == ["cancelled"]
    frame = drift_by_post_status(db_engine, runs, "2026-11-29")
    assert frame["posts_corrected"].sum() == 2
    assert metric(db_engine, "news_comment_reconcile_drift_corrected_total") == 2


def test_retention_leaves_a_materialized_days_value_whole(db_engine: Engine) -> None:
    for _ in range(3):
        add_post(db_engine, comments_count=2)
    reconcile(db_engine, ReconcileOptions(scope=Scope.FULL_SWEEP), partition="2026-08-01")
    reconcile(db_engine, ReconcileOptions(scope=Scope.FULL_SWEEP), partition="2026-08-02")
    before = drift_by_post_status(
        db_engine, reconcile_runs_frame(db_engine, "2026-08-01"), "2026-08-01"
    )
    assert before["posts_corrected"].sum() == 3
    # The clock moved past the job runs' 90 days: their rows go (but the newest).
    run_retention(
        db_engine,
        RetentionOptions(scraping_results_days=30),
        retention_rules(),
        run_id="retention",
        holder="test",
        now=datetime.now(UTC) + timedelta(days=200),
    )
    with db_engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM pin.job_runs WHERE job_code = 'news-comment-reconcile'")
        ).scalar_one()
    assert left == 1
    runs = reconcile_runs_frame(db_engine, "2026-08-01")
    assert len(runs) == 1 and runs["drift_corrected"].iloc[0] == 3
    assert drift_by_post_status(db_engine, runs, "2026-08-01").equals(before)


def test_a_day_without_a_recorded_run_fails_to_load_naming_it(db_engine: Engine) -> None:
    with pytest.raises(analyst.ReconcileValueMissing, match="2026-07-01"):
        reconcile_runs_frame(db_engine, "2026-07-01")


def test_backlog_gauge_after_a_crashed_run(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(6):
        add_post(db_engine, comments_count=1)
    monkeypatch.setattr(reconcile_module, "SLICE_SECONDS", 0.0)
    real_slice = reconcile_module.reconcile_slice
    calls: list[int] = []

    def crash_after_a_batch(*args: Any, **kwargs: Any):
        piece = real_slice(*args, **kwargs)
        if piece.batches:
            calls.append(1)
            raise SystemExit("the process died")
        return piece

    monkeypatch.setattr(reconcile_module, "reconcile_slice", crash_after_a_batch)
    with pytest.raises(SystemExit):
        reconcile(db_engine, ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2))
    assert calls == [1]
    assert metric(db_engine, "news_comment_reconcile_backlog_remaining") == 1


def test_backlog_gauge_while_a_cut_full_sweep_is_pending(db_engine: Engine) -> None:
    posts = [add_post(db_engine, comments_count=1) for _ in range(5)]
    add_comments(db_engine, posts[0], 1)
    cut = reconcile(
        db_engine,
        ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2, max_run_duration_seconds=1e-6),
    )
    assert cut.backlog_remaining is True
    daily = reconcile(db_engine, DAILY)
    assert daily.status == RunStatus.SUCCEEDED
    assert daily.backlog_remaining is True  # the FullSweep pass is still owed
    assert metric(db_engine, "news_comment_reconcile_backlog_remaining") == 1


def test_0023_keeps_the_counters_and_the_recorded_days(empty_db_url: str) -> None:
    """Upgrading copies the runs pin.job_runs holds into the runs' records and what
    retention had retired into one 'retired' row: the Prometheus counters, now read from
    the records, do not go down; those days' drift by post status is unknown, and says so."""
    from pin_orchestration.migrations import upgrade_database
    from pin_orchestration.platform.db import create_db_engine

    upgrade_database(empty_db_url, "0022")
    engine = create_db_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO pin.job_runs (job_code, run_id, status, started_at, "
                    "finished_at, result) VALUES ('news-comment-reconcile', 'old', "
                    '\'cancelled\', now(), now(), \'{"partition": "2026-10-01", '
                    '"scope": "FullSweep", "posts_reconciled": 9, '
                    '"drift_corrected": 4, "corrections": []}\')'
                )
            )
            conn.execute(
                text(
                    "INSERT INTO pin.retired_totals (counter, label, value) VALUES "
                    "('job_runs/news-comment-reconcile/drift_corrected', 'succeeded', 7), "
                    "('job_runs/news-comment-reconcile/posts_reconciled', 'succeeded', 70)"
                )
            )
        upgrade_database(empty_db_url)
        # Before: the live run's 4 plus the retired 7, as 0022's counter read them.
        assert metric(engine, "news_comment_reconcile_drift_corrected_total") == 11
        assert metric(engine, "news_comment_reconcile_posts_reconciled_total") == 79
        runs = reconcile_runs_frame(engine, "2026-10-01")
        assert list(runs[["run_id", "status", "drift_corrected"]].iloc[0]) == [
            "old",
            "cancelled",
            4,
        ]
        with pytest.raises(analyst.ReconcileValueMissing, match="2026-10-01.*0023"):
            drift_by_post_status(engine, runs, "2026-10-01")
    finally:
        engine.dispose()
