"""Every failed run of every job counted into pin.job_runs, so a job's error metric and its
`no_failed_runs` check see failures the run itself never recorded: bad config rejected
before the work started, a crashed run worker, a failed resource.

Seeing every run: Dagster's run-status sensors walk the run-status event log with a cursor
and take up to DAGSTER_RUN_STATUS_SENSOR_PROCESS_LIMIT (default 5) matching runs per tick;
the rest wait for the next tick, none is skipped (DAGSTER-NOTES' "5 runs per tick").
`pin up` raises that limit (`RUN_STATUS_SENSOR_PROCESS_LIMIT`) so a burst of failures is
counted within a tick or two; deploy.md says to set it on the daemon. The record itself is
idempotent per run, so a tick replayed after a daemon crash counts nothing twice.
"""

from datetime import UTC, datetime

from dagster import DefaultSensorStatus, RunFailureSensorContext, run_failure_sensor

from pin_orchestration.coordination.job_identity import JOB_CODE_TAG
from pin_orchestration.coordination.jobruns import record_failed_run
from pin_orchestration.news.reconcile import RECONCILE_JOB
from pin_orchestration.resources.database import DatabaseResource

# How many failed runs the daemon takes per tick (Dagster's default is 5).
RUN_STATUS_SENSOR_PROCESS_LIMIT = 50

# Runs launched for an asset rather than through its job (backfills from the asset page,
# the analysts' automation) run as Dagster's implicit asset job: the asset tells whose run
# it was. An asset job's asset is the job's (its identity names it); any other asset's runs
# are known by the asset's step name (`chessboard__project_aggregates`), which its area's
# no_failed_runs check counts (definitions.py). Every asset job tagged with its code is here:
# tests/test_run_failures.py reads them off the code location.
ASSET_JOBS = (RECONCILE_JOB,)


def asset_job_code(asset_key: str) -> str:
    """The job_code of asset-job runs of an asset (`area/name` → `area__name`)."""
    return asset_key.replace("/", "__")


def job_code_of_run(job_name: str, tags: dict[str, str], asset_keys: list[str]) -> str:
    """The job_code pin.job_runs knows the run by: its `pin/job` tag, else its asset's job,
    else (the implicit asset job) its first asset's code, else the Dagster job name."""
    if JOB_CODE_TAG in tags:
        return tags[JOB_CODE_TAG]
    for job in ASSET_JOBS:
        if job.asset_key in asset_keys:
            return job.code
    if asset_keys:
        return asset_job_code(sorted(asset_keys)[0])
    return job_name


def failure_text(context: RunFailureSensorContext) -> str:
    """The run's failure plus each failed step's error: what the operator needs first."""
    lines = [context.failure_event.message or "run failed"]
    for step_failure in context.get_step_failure_events():
        error = step_failure.step_failure_data.error
        lines.append(f"{step_failure.step_key}: {error.message.strip() if error else '?'}")
    return "\n".join(lines)


# No monitored_jobs: every job of this code location, present and future.
@run_failure_sensor(
    name="record_failed_runs",
    description="Counts every failed run of each job into pin.job_runs (status failed): "
    "the job's errors metric and no_failed_runs check see it",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
)
def record_failed_runs(context: RunFailureSensorContext, database: DatabaseResource) -> None:
    run = context.dagster_run
    record = context.instance.get_run_record_by_id(run.run_id)
    started = record.start_time if record is not None else None
    asset_keys = ["/".join(key.path) for key in (run.asset_selection or [])]
    counted = record_failed_run(
        database.get_engine(),
        job_code=job_code_of_run(run.job_name, dict(run.tags), asset_keys),
        run_id=run.run_id,
        started_at=datetime.fromtimestamp(started, UTC) if started else datetime.now(UTC),
        error=failure_text(context),
    )
    if counted:
        context.log.info("counted failed run %s of %s", run.run_id, run.job_name)
