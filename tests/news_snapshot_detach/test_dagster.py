"""news_snapshot_detach_retry run by Dagster (in-process) against the selections stand-in."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import requests
from dagster import AssetSelection, DagsterInstance, SensorResult, build_sensor_context, materialize
from sqlalchemy import Engine, text

from pin_orchestration.assets.news_snapshot_detach import (
    QUARANTINE_CHECK,
    STALLED_CHECK,
    snapshot_detach_outbox,
    snapshot_detach_outbox_checks,
)
from pin_orchestration.devstack.standins.selections import SelectionsStandIn
from pin_orchestration.jobs.news_snapshot_detach import (
    news_snapshot_detach_requeue,
    news_snapshot_detach_retry,
)
from pin_orchestration.news.snapshot_detach.outbox import enqueue_snapshot_detach
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.selections import SelectionsResource
from pin_orchestration.sensors import news_snapshot_detach as sensor_module
from pin_orchestration.sensors.news_snapshot_detach import news_snapshot_detach_outbox_sensor

OP = "drain_snapshot_detach_outbox"


@pytest.fixture
def stand_in() -> Iterator[SelectionsStandIn]:
    with SelectionsStandIn(token="m2m") as server:
        yield server


def resources(db_url: str, stand_in: SelectionsStandIn) -> dict:
    return {
        "database": DatabaseResource(url=db_url),
        "selections": SelectionsResource(url=stand_in.url, token="m2m"),
    }


def enqueue(engine: Engine, n: int) -> list[uuid.UUID]:
    snapshots = [uuid.uuid4() for _ in range(n)]
    with engine.begin() as conn:
        for s in snapshots:
            enqueue_snapshot_detach(conn, s, uuid.uuid4(), "BlockReplaced")
    return snapshots


def statuses(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(
            conn.execute(
                text("SELECT status, count(*) FROM news.snapshot_detach_outbox GROUP BY status")
            ).all()
        )


def test_job_drains_the_outbox_in_process(
    db_url: str, db_engine: Engine, stand_in: SelectionsStandIn
) -> None:
    snapshots = enqueue(db_engine, 25)
    result = news_snapshot_detach_retry.execute_in_process(
        run_config={"ops": {OP: {"config": {"batch_size": 10, "max_concurrency": 4}}}},
        resources=resources(db_url, stand_in),
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    assert statuses(db_engine) == {"Done": 25}
    assert stand_in.detached == {str(s) for s in snapshots}
    (observation,) = [
        e.event_specific_data.asset_observation
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    meta = {k: v.value for k, v in observation.metadata.items()}
    assert (meta["pending"], meta["run_succeeded"], meta["quarantined"]) == (0, 25, 0)
    with db_engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT status FROM pin.job_runs WHERE run_id = :r"), {"r": result.run_id}
            ).scalar_one()
            == "succeeded"
        )


def test_quarantine_shows_as_failed_check_and_error_event(
    db_url: str, db_engine: Engine, stand_in: SelectionsStandIn
) -> None:
    [snapshot] = enqueue(db_engine, 1)
    stand_in.fail(503)
    instance = DagsterInstance.ephemeral()
    result = news_snapshot_detach_retry.execute_in_process(
        run_config={"ops": {OP: {"config": {"max_attempts": 1}}}},
        resources=resources(db_url, stand_in),
        instance=instance,
    )
    assert result.success
    assert statuses(db_engine) == {"Quarantined": 1}
    errors = [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if entry.level == logging.ERROR
    ]
    assert len(errors) == 1
    assert "SnapshotDetachQuarantinedEvent" in errors[0] and str(snapshot) in errors[0]
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks[QUARANTINE_CHECK].passed is False
    assert checks[STALLED_CHECK].passed is True

    # The check run on demand from the UI says the same.
    checked = materialize(
        [snapshot_detach_outbox, snapshot_detach_outbox_checks],
        selection=AssetSelection.all_asset_checks(),
        resources={"database": DatabaseResource(url=db_url)},
        instance=DagsterInstance.ephemeral(),
    )
    on_demand = {c.check_name: c.passed for c in checked.get_asset_check_evaluations()}
    assert on_demand == {QUARANTINE_CHECK: False, STALLED_CHECK: True}

    # Runbook job: back to Pending with a fresh budget; the next run detaches it.
    requeue = news_snapshot_detach_requeue.execute_in_process(
        run_config={
            "ops": {
                "requeue_quarantined_snapshot_detach": {"config": {"snapshot_id": str(snapshot)}}
            }
        },
        resources={"database": DatabaseResource(url=db_url)},
        instance=DagsterInstance.ephemeral(),
    )
    assert requeue.success
    stand_in.recover()
    news_snapshot_detach_retry.execute_in_process(
        resources=resources(db_url, stand_in), instance=DagsterInstance.ephemeral()
    )
    assert statuses(db_engine) == {"Done": 1}


def test_invalid_config_fails_the_run_naming_the_field(
    db_url: str, db_engine: Engine, stand_in: SelectionsStandIn
) -> None:
    enqueue(db_engine, 1)
    result = news_snapshot_detach_retry.execute_in_process(
        run_config={"ops": {OP: {"config": {"batch_size": 0}}}},
        resources=resources(db_url, stand_in),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    assert "batch_size must be > 0" in str(result.failure_data_for_node(OP).error)
    assert statuses(db_engine) == {"Pending": 1}


def test_stand_in_is_idempotent_checks_the_token_and_can_be_told_to_fail(
    stand_in: SelectionsStandIn,
) -> None:
    url = f"{stand_in.url}/internal/snapshots/{uuid.uuid4()}/detach"
    auth = {"Authorization": "Bearer m2m"}
    assert requests.post(url, json={"reason": "PostDeleted"}, timeout=5).status_code == 401
    first = requests.post(url, json={"reason": "PostDeleted"}, headers=auth, timeout=5)
    again = requests.post(url, json={"reason": "PostDeleted"}, headers=auth, timeout=5)
    assert (first.status_code, first.json()["status"]) == (200, "Detached")
    assert (again.status_code, again.json()["status"]) == (200, "AlreadyDetached")
    requests.post(f"{stand_in.url}/admin/fail", json={"status": 502, "count": 1}, timeout=5)
    assert requests.post(url, json={}, headers=auth, timeout=5).status_code == 502
    assert requests.post(url, json={}, headers=auth, timeout=5).status_code == 200
    assert requests.get(f"{stand_in.url}/admin/state", timeout=5).json()["detached"] == 1


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
    from pin_orchestration.platform.settings import SettingsError

    monkeypatch.setenv("PIN_SNAPSHOT_DETACH_POLLING_SECONDS", "0")
    with pytest.raises(SettingsError, match="PIN_SNAPSHOT_DETACH_POLLING_SECONDS"):
        evaluate(db_url)


def test_the_stalled_check_reads_one_clock_the_databases(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's clock 20 min ahead of the database's: a row that fell due just now (by
    the database) is not stalled, and one due for 20 min is, whatever the daemon says."""
    ahead = datetime.now(UTC) + timedelta(minutes=20)
    monkeypatch.setattr(sensor_module, "_now", lambda: ahead)
    with db_engine.begin() as conn:
        enqueue_snapshot_detach(conn, uuid.uuid4(), uuid.uuid4(), "BlockReplaced")
        conn.execute(text("UPDATE news.snapshot_detach_outbox SET next_attempt_at = now()"))
    checks = {e.check_name: e.passed for e in evaluate(db_url).asset_events}
    assert checks["worker_not_stalled"] is True

    behind = datetime.now(UTC) - timedelta(minutes=20)
    monkeypatch.setattr(sensor_module, "_now", lambda: behind)
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE news.snapshot_detach_outbox SET next_attempt_at = now() - interval '20 min'"
            )
        )
    checks = {e.check_name: e.passed for e in evaluate(db_url).asset_events}
    assert checks["worker_not_stalled"] is False
