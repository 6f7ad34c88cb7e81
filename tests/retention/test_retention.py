"""pin-retention on real PostgreSQL, with row ages set by the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import generate_latest
from sqlalchemy import Engine, text

from pin_orchestration.areas import metrics_registry, retention_rules
from pin_orchestration.coordination.jobruns import RunStatus, record_job_run
from pin_orchestration.coordination.retention import (
    RetentionConfigError,
    RetentionOptions,
    run_retention,
)

NOW = datetime.now(UTC)


def ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def detach_row(engine: Engine, status: str, done_days_ago: float, lag_seconds: float = 5) -> None:
    updated = ago(done_days_ago)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO news.snapshot_detach_outbox "
                "(id, snapshot_id, post_id, reason, status, attempts, created_at, updated_at) "
                "VALUES (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), "
                "'PostDeleted', :status, 1, :created, :updated)"
            ),
            {
                "status": status,
                "created": updated - timedelta(seconds=lag_seconds),
                "updated": updated,
            },
        )


def event(engine: Engine, published_days_ago: float | None) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO chessboard.event_outbox "
                "(topic, entity, entity_id, version, payload, created_at, published_at) "
                "VALUES ('t', 'project', gen_random_uuid(), 1, '{}', :created, :published)"
            ),
            {
                "created": ago(100),
                "published": None if published_days_ago is None else ago(published_days_ago),
            },
        )


def job_run(
    engine: Engine, job_code: str, status: str, days_ago: float, result: dict | None = None
) -> None:
    record_job_run(
        engine,
        job_code=job_code,
        run_id=str(uuid.uuid4()),
        status=status,
        started_at=ago(days_ago),
        result=result or {},
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE pin.job_runs SET finished_at = :at "
                "WHERE id = (SELECT max(id) FROM pin.job_runs)"
            ),
            {"at": ago(days_ago)},
        )


def retain(engine: Engine, **options) -> object:
    return run_retention(
        engine,
        RetentionOptions(**options),
        retention_rules(),
        run_id="test",
        holder="test",
        now=NOW,
    )


def remaining(engine: Engine, sql: str) -> Counter:
    with engine.connect() as conn:
        return Counter(tuple(r) for r in conn.execute(text(sql)).all())


def test_deletes_what_is_older_than_its_age_in_batches_and_nothing_else(
    db_engine: Engine,
) -> None:
    for _ in range(3):
        detach_row(db_engine, "Done", 31)
    detach_row(db_engine, "Done", 29)
    detach_row(db_engine, "Pending", 100)
    detach_row(db_engine, "Quarantined", 100)
    event(db_engine, 31)
    event(db_engine, 31)
    event(db_engine, 1)
    event(db_engine, None)  # never published: the publisher's backlog
    for days in (200, 150, 120, 100):
        job_run(db_engine, "some-job", "succeeded", days)
    job_run(db_engine, "some-job", "failed", 95)  # the newest run of its job
    job_run(db_engine, "some-job", "succeeded", 10)

    result = retain(db_engine, batch_size=2)

    assert result.status == RunStatus.SUCCEEDED
    assert result.deleted == {
        "snapshot_detach_done": 3,
        "chessboard_published_events": 2,
        "job_runs": 5,
        "scraping_results": 0,
        "scraping_attempt_objects": 0,
    }
    assert result.batches > 3  # two rows per transaction
    assert remaining(db_engine, "SELECT status FROM news.snapshot_detach_outbox") == Counter(
        {("Done",): 1, ("Pending",): 1, ("Quarantined",): 1}
    )
    assert remaining(
        db_engine, "SELECT published_at IS NULL FROM chessboard.event_outbox"
    ) == Counter({(False,): 1, (True,): 1})
    # The retention run itself is recorded; of some-job only the 10-day-old run is left.
    assert remaining(db_engine, "SELECT job_code, status FROM pin.job_runs") == Counter(
        {("some-job", "succeeded"): 1, ("pin-retention", "succeeded"): 1}
    )
    assert retain(db_engine).deleted == {
        "snapshot_detach_done": 0,
        "chessboard_published_events": 0,
        "job_runs": 0,
        "scraping_results": 0,
        "scraping_attempt_objects": 0,
    }


def test_the_newest_run_and_newest_success_of_each_job_stay_whatever_their_age(
    db_engine: Engine,
) -> None:
    job_run(db_engine, "news-comment-reconcile", "succeeded", 200)
    job_run(db_engine, "news-comment-reconcile", "succeeded", 150)
    job_run(db_engine, "news-comment-reconcile", "failed", 120)
    retain(db_engine)
    with db_engine.connect() as conn:
        left = conn.execute(
            text(
                "SELECT status, round(extract(epoch FROM :now - finished_at) / 86400) "
                "FROM pin.job_runs WHERE job_code = 'news-comment-reconcile' ORDER BY 2"
            ),
            {"now": NOW},
        ).all()
    # "Last success" and "latest backlog_remaining" still have their answers.
    assert [tuple(r) for r in left] == [("failed", 120), ("succeeded", 150)]


def scrape(engine: Engine) -> dict[str, float]:
    exposition = generate_latest(metrics_registry(engine)).decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith(("news_comment_reconcile_", "news_snapshot_detach_"))
        and not line.startswith("#")
        and "_created" not in line
    }


def test_counters_and_histograms_do_not_go_down_when_their_rows_are_deleted(
    db_engine: Engine,
) -> None:
    for days, lag in ((40, 3), (35, 700), (31, 90000), (2, 20)):
        detach_row(db_engine, "Done", days, lag_seconds=lag)
    reconcile_runs = [
        ("succeeded", 120, {"posts_reconciled": 500, "drift_corrected": 7, "duration_ms": 450}),
        ("failed", 110, {"posts_reconciled": 20, "drift_corrected": 1, "duration_ms": 70000}),
        ("skipped", 100, {"posts_reconciled": 0, "drift_corrected": 0, "duration_ms": 3}),
        ("succeeded", 95, {"posts_reconciled": 900, "drift_corrected": 2, "duration_ms": 2500}),
        ("succeeded", 1, {"posts_reconciled": 10, "drift_corrected": 0, "duration_ms": 90}),
    ]
    for status, days, result in reconcile_runs:
        job_run(db_engine, "news-comment-reconcile", status, days, result)
        # The work counters read the runs' own record (news.comment_reconcile_runs), which
        # the reconcile writes beside pin.job_runs and retention never deletes.
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO news.comment_reconcile_runs (run_id, scope, status, "
                    "started_at, finished_at, posts_reconciled, drift_corrected) "
                    "VALUES (:run_id, 'DailyWindow', :status, :at, :at, :posts, :drift)"
                ),
                {
                    "run_id": str(uuid.uuid4()),
                    "status": status,
                    "at": ago(days),
                    "posts": result["posts_reconciled"],
                    "drift": result["drift_corrected"],
                },
            )
    for days, counts in ((100, (3, 2, 2, 0)), (92, (1, 0, 1, 1)), (1, (4, 1, 1, 0))):
        succeeded, retried, failed, quarantined = counts
        job_run(
            db_engine,
            "news-snapshot-detach-retry",
            "succeeded",
            days,
            {
                "succeeded": succeeded,
                "retried": retried,
                "failed": failed,
                "quarantined": quarantined,
                "duration_ms": 10,
            },
        )
    before = scrape(db_engine)
    result = retain(db_engine)
    assert result.deleted["snapshot_detach_done"] == 3
    assert result.deleted["job_runs"] == 6
    after = scrape(db_engine)
    assert after == before
    assert before["news_comment_reconcile_posts_reconciled_total"] == 1430
    assert before["news_snapshot_detach_lag_seconds_count"] == 4


@pytest.mark.parametrize("field", ["job_runs_days", "snapshot_detach_done_days", "batch_size"])
def test_config_error_names_the_field(db_engine: Engine, field: str) -> None:
    with pytest.raises(RetentionConfigError, match=field):
        retain(db_engine, **{field: 0})


def test_pin_retention_run_from_the_shell(db_url: str, db_engine: Engine) -> None:
    detach_row(db_engine, "Done", 10)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pin_orchestration.cli",
            "retention",
            "run",
            "--snapshot-detach-done-days",
            "7",
        ],
        env={**os.environ, "PIN_DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["deleted"]["snapshot_detach_done"] == 1
