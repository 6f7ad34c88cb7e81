"""Metrics exposition, demo data and the `pin chessboard` runbook commands."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from prometheus_client import generate_latest
from sqlalchemy import Engine, text

from pin_orchestration.areas import metrics_registry
from pin_orchestration.chessboard.drain import drain_tick
from pin_orchestration.chessboard.queue import request_project_recalc
from pin_orchestration.chessboard.recalc import find_divergence
from pin_orchestration.cli import main
from pin_orchestration.definitions import build_definitions
from pin_orchestration.devstack.demo import seed_demo_data
from tests.chessboard.world import add_object, add_project, queue_row

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def test_metrics_expose_the_seed_names_from_durable_state(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        a, b = add_project(conn), add_project(conn)
        add_object(conn, a, status="Free", price="1")
        for _ in range(3):
            request_project_recalc(conn, a, uuid.uuid4(), "Crud", now=T0)
        request_project_recalc(conn, b, uuid.uuid4(), "Crud", now=T0 + timedelta(hours=1))
    drain_tick(db_engine, now=T0 + timedelta(minutes=1))

    body = generate_latest(metrics_registry(db_engine)).decode()

    assert "chessboard_recalc_queue_depth 1.0" in body
    assert "chessboard_recalc_due_backlog" in body
    assert 'chessboard_recalc_runs_total{result="recalculated"} 1.0' in body
    assert "chessboard_recalc_coalesced_events_total 3.0" in body
    assert 'chessboard_recalc_republished_total{entity="project"} 1.0' in body
    assert 'chessboard_recalc_process_duration_seconds_bucket{le="+Inf"} 1.0' in body
    assert "chessboard_recalc_process_duration_seconds_count 1.0" in body
    assert "chessboard_outbox_pending 1.0" in body
    assert "chessboard_recalc_poison_rows 0.0" in body


def test_demo_seed_is_idempotent_and_queues_its_projects(db_engine: Engine) -> None:
    first = seed_demo_data(db_engine)["chessboard"]
    second = seed_demo_data(db_engine)["chessboard"]
    assert first["projects"] == 20 and first["property_objects"] == 20 * 200
    assert set(second.values()) == {0}
    with db_engine.connect() as conn:
        queued = conn.execute(
            text("SELECT count(*) FROM chessboard.project_recalc_requests")
        ).scalar()
    assert queued == 20


def _pin(db_url: str, *args: str):
    return CliRunner().invoke(main, ["chessboard", *args], env={"PIN_DATABASE_URL": db_url})


def test_cli_runbook_actions(db_url: str, db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn, property_objects_free_count=9)
        add_object(conn, p, status="Free", price="1")

    diverged = _pin(db_url, "check-divergence", str(p))
    assert diverged.exit_code == 1 and '"entity": "project"' in diverged.output

    assert _pin(db_url, "force-recalc", str(p)).exit_code == 0
    with db_engine.connect() as conn:
        assert queue_row(conn, p)["last_reason"] == "Manual"
    drained = _pin(db_url, "drain")
    assert drained.exit_code == 0, drained.output
    assert json.loads(drained.output)["recalculated"] == 1
    assert _pin(db_url, "check-divergence", str(p)).exit_code == 0

    with db_engine.begin() as conn:
        request_project_recalc(conn, p, p, "Crud")
        conn.execute(text("UPDATE chessboard.project_recalc_requests SET attempt_count = 5"))
    status = json.loads(_pin(db_url, "status").output)
    assert status["queue"]["poison"] == 1
    assert _pin(db_url, "reset-poison", str(p)).exit_code == 0
    with db_engine.connect() as conn:
        assert queue_row(conn, p)["attempt_count"] == 0
        assert find_divergence(conn, p) == []
    assert _pin(db_url, "force-recalc", str(uuid.uuid4())).exit_code == 1


def test_code_location_has_the_chessboard_names() -> None:
    repo = build_definitions().get_repository_def()
    assets = {key.to_user_string() for key in repo.asset_graph.get_all_asset_keys()}
    checks = {f"{k.asset_key.to_user_string()}:{k.name}" for k in repo.asset_graph.asset_check_keys}
    assert "chessboard/project_aggregates" in assets
    assert {
        "chessboard/project_aggregates:aggregates_match_source_of_truth",
        "chessboard/recalc_health:no_poison_recalc_requests",
    } <= checks
    assert {
        "chessboard_project_recalc_drain",
        "chessboard_force_recalc",
        "chessboard_reset_poison_row",
        "chessboard_divergence_check",
        "chessboard_publish_outbox",
    } <= {j.name for j in repo.get_all_jobs()}
    sensors = {s.name: s for s in repo.sensor_defs}
    assert sensors["chessboard_project_recalc_sensor"].default_status.value == "RUNNING"
    assert sensors["chessboard_project_recalc_sensor"].minimum_interval_seconds == 5


def _gauge(engine: Engine, name: str) -> float:
    body = generate_latest(metrics_registry(engine)).decode()
    (value,) = [line.split()[-1] for line in body.splitlines() if line.startswith(name + " ")]
    return float(value)


def test_an_empty_tick_still_marks_the_worker_alive(db_engine: Engine) -> None:
    assert _gauge(db_engine, "chessboard_recalc_last_tick_timestamp_seconds") == 0.0
    before = datetime.now(UTC).timestamp()

    assert drain_tick(db_engine).outcomes == []  # nothing queued: an idle, live worker

    assert _gauge(db_engine, "chessboard_recalc_last_tick_timestamp_seconds") >= before - 1


def test_oldest_due_age_leaves_out_poison_rows(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        poison, fresh = add_project(conn), add_project(conn)
        day_ago = datetime.now(UTC) - timedelta(days=1)
        request_project_recalc(conn, poison, uuid.uuid4(), "Crud", now=day_ago)
        conn.execute(text("UPDATE chessboard.project_recalc_requests SET attempt_count = 5"))
    # Only the poison row is due (for a day): the backlog has no age.
    assert _gauge(db_engine, "chessboard_recalc_oldest_due_age_seconds") == 0.0
    assert _gauge(db_engine, "chessboard_recalc_poison_rows") == 1.0

    with db_engine.begin() as conn:
        request_project_recalc(conn, fresh, uuid.uuid4(), "Crud", now=datetime.now(UTC))
        conn.execute(
            text(
                "UPDATE chessboard.project_recalc_requests "
                "SET due_at = now() - interval '90 seconds' WHERE project_id = :p"
            ),
            {"p": fresh},
        )
    assert 89 <= _gauge(db_engine, "chessboard_recalc_oldest_due_age_seconds") < 200
