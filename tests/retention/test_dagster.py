"""pin_retention in Dagster: the daily schedule and the job run in process."""

from __future__ import annotations

from dagster import DagsterInstance
from sqlalchemy import Engine, text

from pin_orchestration.definitions import build_definitions
from pin_orchestration.jobs.retention import pin_retention_job
from pin_orchestration.resources.database import DatabaseResource
from tests.retention.test_retention import detach_row


def test_daily_schedule_targets_the_retention_job() -> None:
    repo = build_definitions().get_repository_def()
    schedule = repo.get_schedule_def("pin_retention")
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("30 2 * * *", "Europe/Moscow")
    assert schedule.job_name == "pin_retention"
    assert schedule.default_status.value == "RUNNING"


def test_job_deletes_with_the_configured_ages(db_url: str, db_engine: Engine) -> None:
    detach_row(db_engine, "Done", 10)
    detach_row(db_engine, "Done", 3)
    result = pin_retention_job.execute_in_process(
        run_config={"ops": {"delete_expired_rows": {"config": {"snapshot_detach_done_days": 5}}}},
        resources={"database": DatabaseResource(url=db_url)},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM news.snapshot_detach_outbox")).scalar() == 1


def test_invalid_age_fails_the_run_naming_the_field(db_url: str) -> None:
    result = pin_retention_job.execute_in_process(
        run_config={"ops": {"delete_expired_rows": {"config": {"job_runs_days": 1}}}},
        resources={"database": DatabaseResource(url=db_url)},
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    assert "job_runs_days" in str(result.all_events)
