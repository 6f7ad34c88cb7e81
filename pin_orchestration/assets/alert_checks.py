"""What the areas' alert checks share: the health assets they sit on, the "no failed runs"
check, and the figures a previous observation recorded (for alerts on growth).

Each area's alerts live on an unpartitioned health asset (news/comment_reconcile_health,
news/snapshot_detach_outbox, chessboard/recalc_health, scraping/jobs_health): a check on a
partitioned asset shows "Not evaluated" on its page as soon as another partition is
materialized. A health asset is observable: `pin_alert_checks` (every 5 minutes) observes
it, recording the figures its checks judge, then runs the checks.
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    Config,
    DagsterInstance,
    DagsterRunStatus,
    RunsFilter,
    asset_check,
)
from pydantic import Field

from pin_orchestration.coordination.jobruns import RunStatus, count_runs_since
from pin_orchestration.resources.database import DatabaseResource


def last_successful_run(instance: DagsterInstance, job_name: str) -> str:
    records = instance.get_run_records(
        RunsFilter(job_name=job_name, statuses=[DagsterRunStatus.SUCCESS]), limit=1
    )
    end = records[0].end_time if records else None
    return datetime.fromtimestamp(end, UTC).isoformat() if end else "never"


def observed_before(
    context: AssetCheckExecutionContext, key: AssetKey, before: datetime
) -> tuple[datetime, Mapping[str, object]] | None:
    """When the latest observation of `key` made before `before` by another run was made,
    and its metadata (this run observed the asset just now: that is the window's end)."""
    result = context.instance.fetch_observations(
        AssetRecordsFilter(asset_key=key, before_timestamp=before.timestamp()), limit=2
    )
    for record in result.records:
        observation = record.asset_observation
        if record.run_id != context.run.run_id and observation is not None:
            metadata = {name: value.value for name, value in observation.metadata.items()}
            return datetime.fromtimestamp(record.timestamp, UTC), metadata
    return None


class FailedRunsAlertConfig(Config):
    window_seconds: float = Field(
        default=3600, gt=0, description="Failed runs count over this many seconds"
    )


# Drains run all day, so a failure an hour old is still news; the run-failure sensor
# (record_failed_runs) counts every failed run into pin.job_runs under these job codes.
def no_failed_runs_check(asset: AssetKey, job_codes: Sequence[str]) -> AssetChecksDefinition:
    """`no_failed_runs_in_1h` on an area's health asset, over the area's job codes (its
    named jobs', and `asset_job_code` of its assets run as Dagster's implicit asset job:
    backfills, the analysts' automation)."""
    codes = list(job_codes)
    named = ", ".join(codes)

    @asset_check(
        asset=asset,
        description=f"No run of {named} failed in the last hour (config errors included)",
    )
    def no_failed_runs_in_1h(
        context: AssetCheckExecutionContext,
        config: FailedRunsAlertConfig,
        database: DatabaseResource,
    ) -> AssetCheckResult:
        engine = database.get_engine()
        failed_by_code = {
            code: count_runs_since(engine, code, RunStatus.FAILED, config.window_seconds)
            for code in codes
        }
        failed = sum(failed_by_code.values())
        which = ", ".join(f"{n} of {code}" for code, n in failed_by_code.items() if n)
        return AssetCheckResult(
            passed=failed == 0,
            severity=AssetCheckSeverity.WARN,
            description=(
                f"{failed} failed runs in the last {config.window_seconds:g} s ({which}): "
                "open them in Runs (filter by job, or by the asset for __ASSET_JOB runs), "
                "fix the cause (docs/runbooks.md#failed-runs)"
                if failed
                else "no failed runs"
            ),
            metadata={
                "failed_runs": failed,
                "job_codes": named,
                "window_seconds": config.window_seconds,
            },
        )

    return no_failed_runs_in_1h
