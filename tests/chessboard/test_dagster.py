"""Dagster wiring of the chessboard recalc: sensor, drain run, partition materialization,
asset checks — executed for real against PostgreSQL and an ephemeral Dagster instance."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from dagster import (
    AssetKey,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    RunRequest,
    SensorResult,
    SkipReason,
    build_sensor_context,
    materialize,
)
from sqlalchemy import Engine, text

from pin_orchestration.assets.chessboard import (
    DIVERGENCE_CHECK,
    POISON_CHECK,
    aggregates_match_source_of_truth,
    chessboard_projects,
    no_poison_recalc_requests,
    project_aggregates,
)
from pin_orchestration.assets.chessboard_health import recalc_health
from pin_orchestration.chessboard.queue import request_project_recalc
from pin_orchestration.jobs.chessboard import (
    DRAIN_TAGS,
    chessboard_divergence_check,
    chessboard_project_recalc_drain,
)
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.sensors.chessboard import chessboard_project_recalc_sensor, drain_runs_wanted
from tests.chessboard.world import add_object, add_project, outbox, queue_row, row

PROJECT_AGGREGATES = AssetKey(["chessboard", "project_aggregates"])


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def resources(db_url: str) -> dict:
    return {"database": DatabaseResource(url=db_url)}


def raise_due_in(engine: Engine, seconds: float, *project_ids: uuid.UUID) -> None:
    """Requests that fall due `seconds` from now by the database's clock (debounce 30 s)."""
    with engine.begin() as conn:
        at = conn.execute(
            text("SELECT now() - make_interval(secs => 30 - :s)"), {"s": seconds}
        ).scalar()
        for p in project_ids:
            request_project_recalc(conn, p, uuid.uuid4(), "Crud", now=at)


def make_due(engine: Engine, *project_ids: uuid.UUID) -> None:
    """Requests raised a minute ago by the database's clock: due now."""
    raise_due_in(engine, -30, *project_ids)


def due_projects(engine: Engine, n: int) -> list[uuid.UUID]:
    with engine.begin() as conn:
        projects = [add_project(conn) for _ in range(n)]
    make_due(engine, *projects)
    return projects


def evaluate_sensor(instance: DagsterInstance, resources: dict) -> SensorResult | SkipReason:
    return chessboard_project_recalc_sensor(
        build_sensor_context(instance=instance, resources=resources)
    )


def runs_in_flight(instance: DagsterInstance, n: int) -> None:
    for _ in range(n):
        instance.create_run_for_job(
            chessboard_project_recalc_drain, status=DagsterRunStatus.STARTED, tags=DRAIN_TAGS
        )


@pytest.mark.parametrize(
    ("due", "until_due", "in_flight", "wanted"),
    [
        (0, None, 0, 0),  # nothing queued
        (0, 20.0, 0, 0),  # the next evaluation is early enough
        (0, 3.0, 0, 1),  # falls due before the next evaluation: one run ahead of it
        (0, 3.0, 1, 1),  # a second live run covers the first one's end
        (0, 3.0, 2, 0),  # cap reached
        (60, -1.0, 0, 2),  # one per 50 due rows
        (60, -1.0, 1, 1),
        (500, -1.0, 2, 0),  # never beyond the cap, however many are due
        (500, -1.0, 3, 0),  # more in flight than the cap (cap lowered): none, not negative
    ],
)
def test_drain_runs_wanted(due: int, until_due: float | None, in_flight: int, wanted: int) -> None:
    assert drain_runs_wanted(due, until_due, in_flight, batch_size=50) == wanted


def test_sensor_skips_when_nothing_is_due(db_engine: Engine, instance, resources) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
        request_project_recalc(conn, p, uuid.uuid4(), "Crud")  # due in 30 s
    result = evaluate_sensor(instance, resources)
    assert isinstance(result, SkipReason)
    assert "no due recalc requests (depth 1" in result.skip_message


def test_sensor_launches_drain_runs_not_one_per_project(
    db_engine: Engine, instance, resources
) -> None:
    due_projects(db_engine, 60)

    result = evaluate_sensor(instance, resources)

    assert isinstance(result, SensorResult)
    requests = result.run_requests
    assert len(requests) == 2  # 60 due rows / batch 50 → 2 drain runs, within the cap of 2
    assert all(
        isinstance(r, RunRequest) and r.tags["pin/drain"] == DRAIN_TAGS["pin/drain"]
        for r in requests
    )
    assert len({r.run_key for r in requests}) == 2


def test_sensor_launches_a_run_ahead_of_a_row_falling_due(
    db_engine: Engine, instance, resources
) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
    raise_due_in(db_engine, 3, p)

    result = evaluate_sensor(instance, resources)

    assert isinstance(result, SensorResult)
    assert len(result.run_requests) == 1


def test_sensor_does_not_pile_runs_beyond_the_cap(db_engine: Engine, instance, resources) -> None:
    due_projects(db_engine, 120)
    runs_in_flight(instance, 1)

    first = evaluate_sensor(instance, resources)
    assert isinstance(first, SensorResult) and len(first.run_requests) == 1  # 1 + 1 = cap
    runs_in_flight(instance, 1)  # what the daemon does with that request
    second = evaluate_sensor(instance, resources)
    assert isinstance(second, SkipReason)
    assert "2 drain run(s) already in flight" in second.skip_message


def test_a_live_drain_run_takes_a_row_as_it_falls_due(
    db_engine: Engine, instance, resources
) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
        add_object(conn, p, status="Free", price="10")
    raise_due_in(db_engine, 0.5, p)

    # Nothing is due when the run starts: it waits for the row instead of ending empty.
    result = chessboard_project_recalc_drain.execute_in_process(
        instance=instance,
        resources=resources,
        run_config={
            "ops": {
                "drain_chessboard_project_recalc_queue": {
                    "config": {"max_run_duration_seconds": 60}
                }
            }
        },
    )

    assert result.success
    [mat] = result.asset_materializations_for_node("drain_chessboard_project_recalc_queue")
    assert mat.partition == str(p)
    with db_engine.connect() as conn:
        assert queue_row(conn, p) is None


def test_drain_run_materializes_each_recalculated_project(
    db_engine: Engine, instance, resources
) -> None:
    with db_engine.begin() as conn:
        a, b = add_project(conn), add_project(conn)
        add_object(conn, a, status="Free", price="10")
        add_object(conn, b, status="Sold", price="20")
    make_due(db_engine, a, b)

    result = chessboard_project_recalc_drain.execute_in_process(
        instance=instance, resources=resources
    )

    assert result.success
    materialized = {
        m.partition: m.metadata
        for m in result.asset_materializations_for_node("drain_chessboard_project_recalc_queue")
    }
    assert set(materialized) == {str(a), str(b)}
    assert materialized[str(a)]["property_objects_free_count"].value == 1
    assert materialized[str(a)]["republished_project"].value == 1
    assert set(instance.get_dynamic_partitions(chessboard_projects.name)) == {str(a), str(b)}
    with db_engine.connect() as conn:
        assert queue_row(conn, a) is None and queue_row(conn, b) is None


def test_drain_run_raises_the_poison_alert_as_a_failed_check(
    db_engine: Engine, instance, resources
) -> None:
    with db_engine.begin() as conn:
        bad = add_project(conn, property_objects_total_count=3)
        conn.execute(
            text("""
            CREATE FUNCTION public.test_fail() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'corrupt project'; END $$
        """)
        )
        conn.execute(
            text("""CREATE TRIGGER fail BEFORE UPDATE ON chessboard.projects
                             FOR EACH ROW EXECUTE FUNCTION public.test_fail()""")
        )
    make_due(db_engine, bad)
    with db_engine.begin() as conn:
        conn.execute(text("UPDATE chessboard.project_recalc_requests SET attempt_count = 4"))

    result = chessboard_project_recalc_drain.execute_in_process(
        instance=instance, resources=resources
    )

    assert result.success  # other projects would continue; the failure is data, not a crash
    evaluations = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    ]
    assert [(ev.check_name, ev.passed) for ev in evaluations] == [(POISON_CHECK, False)]
    assert "CHESSBOARD_RECALC_POISON" in evaluations[0].description
    with db_engine.connect() as conn:
        assert queue_row(conn, bad)["attempt_count"] == 5

    check = materialize(
        [recalc_health, no_poison_recalc_requests],
        instance=instance,
        resources=resources,
        selection=AssetSelection.checks(no_poison_recalc_requests),
    )
    assert [c.passed for c in check.get_asset_check_evaluations()] == [False]


def test_backfilling_a_partition_forces_a_recalc_and_the_check_confirms_it(
    db_engine: Engine, instance, resources
) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn, property_objects_free_count=7)  # drifted
        add_object(conn, p, status="Free", price="10")
    with db_engine.begin() as conn:  # a pending request is covered by the forced recalc
        request_project_recalc(conn, p, uuid.uuid4(), "Crud")
    instance.add_dynamic_partitions(chessboard_projects.name, [str(p)])

    def check_passed() -> bool:
        run = chessboard_divergence_check.execute_in_process(
            instance=instance,
            resources=resources,
            run_config={"ops": {"check_project_divergence": {"config": {"project_ids": [str(p)]}}}},
        )
        [evaluation] = [
            e.event_specific_data
            for e in run.all_events
            if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
        ]
        assert (evaluation.check_name, evaluation.partition) == (DIVERGENCE_CHECK, str(p))
        return evaluation.passed

    assert not check_passed()

    run = materialize(
        [project_aggregates], instance=instance, resources=resources, partition_key=str(p)
    )

    [mat] = run.asset_materializations_for_node("chessboard__project_aggregates")
    assert mat.partition == str(p)
    assert mat.metadata["property_objects_free_count"].value == 1
    assert check_passed()
    with db_engine.connect() as conn:
        assert row(conn, "projects", p)["version"] == 2
        assert queue_row(conn, p) is None
        assert [e["entity"] for e in outbox(conn)] == ["project"]


def test_materializing_an_archived_project_changes_nothing(
    db_engine: Engine, instance, resources
) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn, status="Archived", property_objects_free_count=7)
    instance.add_dynamic_partitions(chessboard_projects.name, [str(p)])
    run = materialize(
        [project_aggregates], instance=instance, resources=resources, partition_key=str(p)
    )
    [mat] = run.asset_materializations_for_node("chessboard__project_aggregates")
    assert mat.metadata["skipped"].value == "archived"
    with db_engine.connect() as conn:
        assert row(conn, "projects", p)["property_objects_free_count"] == 7


def test_drain_with_nothing_due_is_a_quick_noop(db_engine: Engine, instance, resources) -> None:
    started = datetime.now(UTC)
    result = chessboard_project_recalc_drain.execute_in_process(
        instance=instance, resources=resources
    )
    assert result.success
    assert result.asset_materializations_for_node("drain_chessboard_project_recalc_queue") == []
    assert datetime.now(UTC) - started < timedelta(seconds=30)


def test_the_divergence_check_of_a_project_that_does_not_exist_is_refused(
    db_engine: Engine, instance, resources
) -> None:
    """A mistyped id must not pass as "no divergence" nor leave a partition behind."""
    with db_engine.begin() as conn:
        real = add_project(conn)
    ghost = uuid.uuid4()
    run = chessboard_divergence_check.execute_in_process(
        instance=instance,
        resources=resources,
        run_config={
            "ops": {
                "check_project_divergence": {"config": {"project_ids": [str(real), str(ghost)]}}
            }
        },
        raise_on_error=False,
    )
    assert not run.success
    (failure,) = run.get_step_failure_events()
    message = failure.step_failure_data.error.message
    assert f"no such project: {ghost}" in message and str(real) not in message
    assert instance.get_dynamic_partitions(chessboard_projects.name) == []
    assert [
        e for e in run.all_events if e.event_type == DagsterEventType.ASSET_CHECK_EVALUATION
    ] == []


def test_the_divergence_check_of_a_partition_with_no_project_fails_naming_it(
    db_engine: Engine, instance, resources
) -> None:
    ghost = str(uuid.uuid4())
    instance.add_dynamic_partitions(chessboard_projects.name, [ghost])
    run = materialize(
        [project_aggregates, aggregates_match_source_of_truth],
        instance=instance,
        resources=resources,
        partition_key=ghost,
        raise_on_error=False,
    )
    assert not run.success
    (failure,) = run.get_step_failure_events()
    assert f"no such project: {ghost}" in failure.step_failure_data.error.message
