"""Queue alerts as asset checks on the assets the queues feed, so they show on the asset
pages: the chessboard recalc queue and the scraping queue not stalled, no scraping job
running past its lease. `pin_alert_checks` (scheduled every 5 minutes) evaluates them with
the other state-based alerts."""

from datetime import UTC, datetime

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    DagsterRunStatus,
    RunsFilter,
    asset_check,
)

from pin_orchestration.assets.chessboard import PROJECT_AGGREGATES
from pin_orchestration.assets.news_snapshot_detach import OUTBOX_ASSET_KEY
from pin_orchestration.assets.scraping import SCRAPING_RESULTS
from pin_orchestration.jobruns import RunStatus, count_runs_since
from pin_orchestration.jobs.chessboard import DRAIN_JOB
from pin_orchestration.jobs.scraping import WORKER_JOB
from pin_orchestration.news.snapshot_detach.policy import JOB_CODE as DETACH_JOB_CODE
from pin_orchestration.queue_health import (
    STALLED_AFTER,
    Backlog,
    chessboard_backlog,
    scraping_backlog,
    scraping_jobs_past_lease,
)
from pin_orchestration.resources.database import DatabaseResource


def _last_success(context: AssetCheckExecutionContext, job_name: str) -> str:
    records = context.instance.get_run_records(
        RunsFilter(job_name=job_name, statuses=[DagsterRunStatus.SUCCESS]), limit=1
    )
    end = records[0].end_time if records else None
    return datetime.fromtimestamp(end, UTC).isoformat() if end else "never"


def _backlog_result(
    context: AssetCheckExecutionContext, backlog: Backlog, job_name: str, runbook: str
) -> AssetCheckResult:
    now = datetime.now(UTC)
    stalled = backlog.stalled(now)
    return AssetCheckResult(
        passed=not stalled,
        severity=AssetCheckSeverity.ERROR,
        description=(
            f"{backlog.due} due, the oldest waiting {backlog.oldest_age_seconds(now):.0f} s "
            f"(> {STALLED_AFTER.total_seconds():.0f} s): {runbook}"
            if stalled
            else f"{backlog.due} due, none waiting too long"
        ),
        metadata={
            "due": backlog.due,
            "oldest_age_seconds": round(backlog.oldest_age_seconds(now), 1),
            f"last_successful_{job_name}_run": _last_success(context, job_name),
        },
    )


@asset_check(
    asset=PROJECT_AGGREGATES,
    name="recalc_queue_not_stalled",
    description="No recalc request due for over 10 min (backlog / oldest age growing, "
    "no successful drain taking it)",
)
def recalc_queue_not_stalled(
    context: AssetCheckExecutionContext, database: DatabaseResource
) -> AssetCheckResult:
    return _backlog_result(
        context,
        chessboard_backlog(database.get_engine()),
        DRAIN_JOB,
        "check chessboard_project_recalc_sensor is running and the last drain runs' logs "
        "(docs/runbooks.md#chessboard-recalc-queue-stalled)",
    )


@asset_check(
    asset=SCRAPING_RESULTS,
    name="scraping_queue_not_stalled",
    description="No queued scraping job due for over 10 min (backlog / oldest age growing, "
    "no worker run taking it)",
)
def scraping_queue_not_stalled(
    context: AssetCheckExecutionContext, database: DatabaseResource
) -> AssetCheckResult:
    return _backlog_result(
        context,
        scraping_backlog(database.get_engine()),
        WORKER_JOB,
        "check scraping_jobs_sensor is running and the last worker runs' logs "
        "(docs/runbooks.md#scraping-queue-stalled)",
    )


@asset_check(
    asset=SCRAPING_RESULTS,
    name="no_jobs_past_lease",
    description="No scraping job is running past its lease (its worker died; the "
    "scraping_stuck_sweeper schedule returns such jobs to the queue every minute)",
)
def no_jobs_past_lease(
    context: AssetCheckExecutionContext, database: DatabaseResource
) -> AssetCheckResult:
    past = scraping_jobs_past_lease(database.get_engine())
    return AssetCheckResult(
        passed=past.count == 0,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"{past.count} running past their lease: run scraping_sweep_expired_leases "
            "or `pin scraping sweep` (docs/runbooks.md#scraping-jobs-past-their-lease)"
            if past.count
            else "no job past its lease"
        ),
        metadata={
            "past_lease": past.count,
            "oldest_expiry": past.oldest_expiry.isoformat() if past.oldest_expiry else "",
        },
    )


# Drains run all day, so a failure an hour old is still news; the run-failure sensor
# (record_failed_runs) counts every failed run into pin.job_runs under these job codes.
FAILED_RUNS_WINDOW_SECONDS = 3600


def no_failed_runs_check(asset: AssetKey, job_code: str) -> AssetChecksDefinition:
    @asset_check(
        asset=asset,
        name="no_failed_runs_in_1h",
        description=f"No {job_code} run failed in the last hour (config errors included)",
    )
    def _check(context: AssetCheckExecutionContext, database: DatabaseResource) -> AssetCheckResult:
        failed = count_runs_since(
            database.get_engine(), job_code, RunStatus.FAILED, FAILED_RUNS_WINDOW_SECONDS
        )
        return AssetCheckResult(
            passed=failed == 0,
            severity=AssetCheckSeverity.WARN,
            description=(
                f"{failed} failed {job_code} runs in the last hour: open them in Runs "
                "(filter by job), fix the cause (docs/runbooks.md#failed-runs)"
                if failed
                else "no failed runs"
            ),
            metadata={"failed_runs": failed, "job_code": job_code},
        )

    return _check


QUEUE_CHECKS = [
    recalc_queue_not_stalled,
    scraping_queue_not_stalled,
    no_jobs_past_lease,
    no_failed_runs_check(PROJECT_AGGREGATES, DRAIN_JOB),
    no_failed_runs_check(SCRAPING_RESULTS, WORKER_JOB),
    no_failed_runs_check(OUTBOX_ASSET_KEY, DETACH_JOB_CODE),
]
