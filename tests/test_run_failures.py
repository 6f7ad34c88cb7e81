"""Every failed Dagster run lands in pin.job_runs, so the job's error metric and its
`no_failed_runs` check see it — a run that failed on bad config included."""

from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterInstance, build_run_status_sensor_context
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from pin_orchestration.areas import metrics_registry
from pin_orchestration.definitions import build_definitions
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.sensors.run_failures import job_code_of_run, record_failed_runs


def reconcile_errors_total(engine: Engine) -> float:
    families = text_string_to_metric_families(generate_latest(metrics_registry(engine)).decode())
    return next(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == "news_comment_reconcile_errors_total"
    )


def test_a_reconcile_run_failed_on_bad_config_counts_everywhere(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    defs = build_definitions()
    instance = DagsterInstance.ephemeral()
    failed = defs.resolve_job_def("news_comment_reconcile").execute_in_process(
        run_config={"ops": {"news__post_comment_counts": {"config": {"batch_size": 0}}}},
        partition_key="2026-11-29",
        instance=instance,
        raise_on_error=False,
    )
    assert not failed.success
    assert reconcile_errors_total(db_engine) == 0  # the asset never reached its own record

    def sensor_sees_the_failure() -> None:
        context = build_run_status_sensor_context(
            sensor_name="record_failed_runs",
            dagster_event=failed.get_run_failure_event(),
            dagster_instance=instance,
            dagster_run=failed.dagster_run,
            resources={"database": DatabaseResource(url=db_url)},
        ).for_run_failure()
        record_failed_runs(context)

    sensor_sees_the_failure()
    sensor_sees_the_failure()  # a tick replayed after a crash counts it once
    with db_engine.connect() as conn:
        rows = conn.execute(
            text("SELECT job_code, run_id, status, result->>'error' FROM pin.job_runs")
        ).all()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("news-comment-reconcile", failed.run_id, "failed")
    ]
    assert "batch_size" in rows[0][3]
    assert reconcile_errors_total(db_engine) == 1

    health = defs.resolve_job_def("news_comment_reconcile_health").execute_in_process(
        instance=instance
    )
    checks = {e.check_name: e.passed for e in health.get_asset_check_evaluations()}
    assert checks["no_failed_runs_in_26h"] is False


def test_failed_asset_job_runs_count_in_their_areas_check(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forced-recalc backfill and an analysts' frame run are runs of Dagster's implicit
    asset job: their failures must reach the area's no_failed_runs check too."""
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    defs = build_definitions()
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("chessboard_projects", ["not-a-project-id"])
    asset_job = defs.resolve_implicit_global_asset_job_def()
    alerts = defs.resolve_job_def("pin_alert_checks")

    def chessboard_failed_runs_check() -> bool:
        checked = alerts.execute_in_process(instance=instance)
        (evaluation,) = [
            e
            for e in checked.get_asset_check_evaluations()
            if e.asset_key == AssetKey(["chessboard", "recalc_health"])
            and e.check_name == "no_failed_runs_in_1h"
        ]
        return evaluation.passed

    assert chessboard_failed_runs_check()
    for asset in (["chessboard", "project_aggregates"], ["chessboard", "building_free_share"]):
        failed = asset_job.execute_in_process(
            instance=instance,
            partition_key="not-a-project-id",
            asset_selection=[AssetKey(asset)],
            raise_on_error=False,
        )
        assert not failed.success
        context = build_run_status_sensor_context(
            sensor_name="record_failed_runs",
            dagster_event=failed.get_run_failure_event(),
            dagster_instance=instance,
            dagster_run=failed.dagster_run,
            resources={"database": DatabaseResource(url=db_url)},
        ).for_run_failure()
        record_failed_runs(context)
    assert not chessboard_failed_runs_check()
    with db_engine.connect() as conn:
        codes = conn.execute(text("SELECT job_code FROM pin.job_runs ORDER BY job_code")).scalars()
        assert list(codes) == ["chessboard__building_free_share", "chessboard__project_aggregates"]


def test_a_run_of_an_asset_jobs_asset_counts_as_the_jobs_run() -> None:
    """A backfill of an asset job's asset (the implicit asset job, no `pin/job` tag) is
    counted under the job's code: every tagged asset job of the code location is known to
    the sensor through its identity, none through a copy of its name."""
    repo = build_definitions().get_repository_def()
    tagged_asset_jobs = [
        job
        for job in repo.get_all_jobs()
        if "pin/job" in job.tags and job.asset_layer.executable_asset_keys
    ]
    assert tagged_asset_jobs, "the reconcile is an asset job with a pin/job tag"
    for job in tagged_asset_jobs:
        for key in job.asset_layer.executable_asset_keys:
            code = job_code_of_run("__ASSET_JOB", {}, [key.to_user_string()])
            assert code == job.tags["pin/job"], job.name
