"""Job of pin-retention: the daily batch delete of old rows (its schedule, `pin_retention`,
is in schedules/retention.py). The op calls
`pin_orchestration.coordination.retention.run_retention`, which runs the named queries of
`retention.sql`."""

# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at decoration time.

from dagster import (
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)

from pin_orchestration.areas import retention_rules
from pin_orchestration.coordination.cancellation import stop_requested_on_signals
from pin_orchestration.coordination.jobruns import RunStatus
from pin_orchestration.coordination.locks import default_holder
from pin_orchestration.coordination.retention import RETENTION_JOB, RetentionOptions, run_retention
from pin_orchestration.platform.options import dagster_config
from pin_orchestration.resources.database import DatabaseResource

RetentionConfig = dagster_config(
    RetentionOptions, "RetentionConfig", "Ages (days) and batching of pin-retention"
)


@op
def delete_expired_rows(
    context: OpExecutionContext, config: RetentionConfig, database: DatabaseResource
) -> None:
    """Delete Done detach intents, published chessboard events, job runs and stored
    scraping results older than their ages, in batches."""
    options: RetentionOptions = config.to_options()  # type: ignore[attr-defined]
    with stop_requested_on_signals(reraise=True) as stop:
        result = run_retention(
            database.get_engine(),
            options,
            retention_rules(),
            run_id=context.run_id,
            holder=default_holder(context.run_id),
            stop_requested=stop,
            logger=context.log,
        )
    if result.status == RunStatus.FAILED:
        raise Failure(f"{RETENTION_JOB.code} failed: {result.error}", metadata=result.summary())


@job(
    name=RETENTION_JOB.name,
    executor_def=in_process_executor,
    tags=RETENTION_JOB.tags,
    description="Delete, in batches, rows older than their configured ages (Done detach "
    "intents and published chessboard events: 30 days; job runs: 90 days; stored "
    "scraping results: PIN_RESULT_RETENTION_DAYS, 30).",
)
def pin_retention_job() -> None:
    delete_expired_rows()
