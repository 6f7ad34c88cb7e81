"""news_snapshot_detach_outbox_sensor: one cheap query per tick, one run per polling window."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context
from sqlalchemy import Engine, text

from pin_orchestration.news.snapshot_detach import enqueue_snapshot_detach
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.sensors import news_snapshot_detach as sensor_module
from pin_orchestration.sensors.news_snapshot_detach import news_snapshot_detach_outbox_sensor


def evaluate(db_url: str, cursor: str | None = None) -> SensorResult:
    context = build_sensor_context(
        instance=DagsterInstance.ephemeral(),
        cursor=cursor,
        resources={"database": DatabaseResource(url=db_url)},
    )
    return news_snapshot_detach_outbox_sensor(context)


def test_no_due_rows_launches_nothing(db_url: str, db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        enqueue_snapshot_detach(conn, uuid.uuid4(), uuid.uuid4(), "PostDeleted")
        conn.execute(
            text("UPDATE news.snapshot_detach_outbox SET next_attempt_at = now() + interval '1 h'")
        )
    result = evaluate(db_url)
    assert result.run_requests == []
    assert "no due Pending rows" in result.skip_reason.skip_message
    # The alert checks are reported on the first tick, then only when they change.
    assert {e.check_name: e.passed for e in result.asset_events} == {
        "no_quarantined_entries": True,
        "worker_not_stalled": True,
    }
    assert evaluate(db_url, result.cursor).asset_events == []


def test_due_rows_launch_one_drain_run_per_polling_window(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIN_SNAPSHOT_DETACH_POLLING_SECONDS", "3600")
    with db_engine.begin() as conn:
        for _ in range(3):
            enqueue_snapshot_detach(conn, uuid.uuid4(), uuid.uuid4(), "BlockReplaced")
    first = evaluate(db_url)
    (request,) = first.run_requests
    assert request.run_key.startswith("news-snapshot-detach-retry:")
    assert request.tags["pin/due_rows"] == "3"
    # The same window: no second run, whatever the number of rows.
    second = evaluate(db_url, first.cursor)
    assert second.run_requests == []
    assert "already has its run" in second.skip_reason.skip_message
    # The next window gets its own run with its own key.
    next_window = datetime.now(UTC) + timedelta(seconds=3600)
    monkeypatch.setattr(sensor_module, "_now", lambda: next_window)
    third = evaluate(db_url, second.cursor)
    (later,) = third.run_requests
    assert later.run_key != request.run_key


def test_quarantined_rows_fail_the_alert_check(db_url: str, db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        enqueue_snapshot_detach(conn, uuid.uuid4(), uuid.uuid4(), "BlockReplaced")
        conn.execute(text("UPDATE news.snapshot_detach_outbox SET status = 'Quarantined'"))
    result = evaluate(db_url)
    checks = {e.check_name: e for e in result.asset_events}
    assert checks["no_quarantined_entries"].passed is False
    assert "SnapshotDetachQuarantinedEvent" in checks["no_quarantined_entries"].description


def test_rows_due_for_15_min_without_a_successful_run_fail_the_stalled_check(
    db_url: str, db_engine: Engine
) -> None:
    with db_engine.begin() as conn:
        enqueue_snapshot_detach(conn, uuid.uuid4(), uuid.uuid4(), "BlockReplaced")
        conn.execute(
            text(
                "UPDATE news.snapshot_detach_outbox SET next_attempt_at = now() - interval '20 min'"
            )
        )
    checks = {e.check_name: e.passed for e in evaluate(db_url).asset_events}
    assert checks["worker_not_stalled"] is False


def test_bad_polling_interval_names_the_variable(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pin_orchestration.settings import SettingsError

    monkeypatch.setenv("PIN_SNAPSHOT_DETACH_POLLING_SECONDS", "0")
    with pytest.raises(SettingsError, match="PIN_SNAPSHOT_DETACH_POLLING_SECONDS"):
        evaluate(db_url)
