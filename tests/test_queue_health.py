"""Queue alerts on the asset pages: backlog whose oldest due item waits too long (chessboard
recalc queue, scraping queue) and scraping jobs running past their lease."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from dagster import DagsterInstance
from sqlalchemy import Engine, text

from pin_orchestration.definitions import build_definitions


def add_recalc_request(engine: Engine, minutes_overdue: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO chessboard.project_recalc_requests
                    (project_id, tenant_id, due_at, first_requested_at, last_reason,
                     created_at, updated_at)
                VALUES (:p, :t, now() - make_interval(mins => :m), now(), 'test', now(), now())
                """
            ),
            {"p": uuid.uuid4(), "t": uuid.uuid4(), "m": minutes_overdue},
        )


def add_scraping_job(engine: Engine, status: str, minutes_ago: int) -> None:
    with engine.begin() as conn:
        tenant = conn.execute(
            text(
                """
                INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix)
                VALUES (:id, :name, :sha, 'k') RETURNING id
                """
            ),
            {"id": uuid.uuid4(), "name": f"t{uuid.uuid4().hex[:8]}", "sha": uuid.uuid4().bytes},
        ).scalar_one()
        conn.execute(
            text(
                """
                INSERT INTO scraping.jobs
                    (id, tenant_id, url, domain, status, next_attempt_at,
                     lease_owner, lease_expires_at)
                VALUES (:id, :tenant, 'https://example.org/', 'example.org', :status,
                        now() - make_interval(mins => :m),
                        CASE WHEN :status = 'running' THEN 'worker' END,
                        CASE WHEN :status = 'running' THEN now() - make_interval(mins => :m) END)
                """
            ),
            {"id": uuid.uuid4(), "tenant": tenant, "status": status, "m": minutes_ago},
        )


def alert_checks(db_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    outcome = (
        build_definitions()
        .resolve_job_def("pin_alert_checks")
        .execute_in_process(instance=DagsterInstance.ephemeral())
    )
    return {e.check_name: e.passed for e in outcome.get_asset_check_evaluations()}


QUEUE_CHECKS = ("recalc_queue_not_stalled", "scraping_queue_not_stalled", "no_jobs_past_lease")


def test_fresh_queues_pass(db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    add_recalc_request(db_engine, minutes_overdue=1)
    add_scraping_job(db_engine, "queued", minutes_ago=1)
    checks = alert_checks(db_url, monkeypatch)
    assert {name: checks[name] for name in QUEUE_CHECKS} == dict.fromkeys(QUEUE_CHECKS, True)


def test_old_backlog_and_expired_leases_fail_their_checks(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_recalc_request(db_engine, minutes_overdue=30)
    add_scraping_job(db_engine, "queued", minutes_ago=30)
    add_scraping_job(db_engine, "running", minutes_ago=5)
    checks = alert_checks(db_url, monkeypatch)
    assert {name: checks[name] for name in QUEUE_CHECKS} == dict.fromkeys(QUEUE_CHECKS, False)


def test_a_failed_drain_run_fails_its_areas_no_failed_runs_check(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pin_orchestration.jobruns import record_failed_run

    assert alert_checks(db_url, monkeypatch)["no_failed_runs_in_1h"]
    record_failed_run(
        db_engine,
        job_code="chessboard_project_recalc_drain",
        run_id="r1",
        started_at=datetime.now(UTC),
        error="boom",
    )
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    outcome = (
        build_definitions()
        .resolve_job_def("pin_alert_checks")
        .execute_in_process(instance=DagsterInstance.ephemeral())
    )
    failed_runs = {
        e.asset_key.to_user_string(): e.passed
        for e in outcome.get_asset_check_evaluations()
        if e.check_name == "no_failed_runs_in_1h"
    }
    assert failed_runs == {
        "chessboard/project_aggregates": False,
        "scraping/results": True,
        "news/snapshot_detach_outbox": True,
    }
