"""Jobs of news-snapshot-detach-retry (seed 001): the drain run (launched by
`news_snapshot_detach_outbox_sensor`, sensors/news_snapshot_detach.py) and the runbook
re-enqueue. The work itself is in the `pin_orchestration.news.snapshot_detach` package: the
drain op calls `worker.run_detach_retry`, which claims through `outbox.py` with the named
queries of `news/snapshot_detach/queries.sql`."""

# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at decoration time.

import uuid

from dagster import (
    AssetObservation,
    Config,
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from pin_orchestration.assets.news_snapshot_detach import OUTBOX_ASSET_KEY, outbox_evaluations
from pin_orchestration.coordination.cancellation import stop_requested_on_signals
from pin_orchestration.coordination.jobruns import RunStatus
from pin_orchestration.coordination.locks import default_holder
from pin_orchestration.news.snapshot_detach.monitoring import outbox_state
from pin_orchestration.news.snapshot_detach.outbox import RequeueError, requeue_quarantined
from pin_orchestration.news.snapshot_detach.policy import DETACH_JOB, DetachOptions
from pin_orchestration.news.snapshot_detach.worker import run_detach_retry
from pin_orchestration.platform.options import dagster_config
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.selections import SelectionsResource

DetachRetryConfig = dagster_config(
    DetachOptions,
    "DetachRetryConfig",
    "SnapshotDetachRetryOptions (seed 001); TimeSpans in seconds",
)


@op
def drain_snapshot_detach_outbox(
    context: OpExecutionContext,
    config: DetachRetryConfig,
    database: DatabaseResource,
    selections: SelectionsResource,
) -> None:
    """Claim due Pending rows, detach them at selections, record outcomes (seed 001)."""
    options: DetachOptions = config.to_options()  # type: ignore[attr-defined]
    options.validate()
    engine = database.get_engine()
    with (
        selections.get_client(pool_size=options.max_concurrency) as client,
        stop_requested_on_signals(reraise=True) as stop,
    ):
        result = run_detach_retry(
            engine,
            client,
            options,
            run_id=context.run_id,
            holder=default_holder(context.run_id),
            stop_requested=stop,
            logger=context.log,
        )
    for event in result.quarantine_events:
        context.log.error(event.describe())
    state = outbox_state(engine)
    context.log_event(
        AssetObservation(
            asset_key=OUTBOX_ASSET_KEY,
            metadata={
                "pending": state.pending,
                "quarantined": state.quarantined,
                "oldest_age_seconds": state.oldest_age_seconds,
                "run_succeeded": result.succeeded,
                "run_retried": result.retried,
                "run_quarantined": result.quarantined,
                "run_superseded": result.superseded,
                "duration_ms": result.duration_ms,
            },
        )
    )
    if result.quarantined:
        for evaluation in outbox_evaluations(engine):
            context.log_event(evaluation)
    if result.status == RunStatus.FAILED:
        raise Failure(f"{DETACH_JOB.code} failed: {result.error}", metadata=result.summary())


@job(
    name=DETACH_JOB.name,
    executor_def=in_process_executor,
    description="Drain news.snapshot_detach_outbox: retry selections detach with backoff "
    "(seed 001). Launched by news_snapshot_detach_outbox_sensor when rows are due.",
    tags=DETACH_JOB.tags,
)
def news_snapshot_detach_retry() -> None:
    drain_snapshot_detach_outbox()


class RequeueConfig(Config):
    """Give exactly one: the outbox row id, or the snapshot id of a Quarantined entry."""

    entry_id: str | None = Field(default=None, description="news.snapshot_detach_outbox.id")
    snapshot_id: str | None = Field(default=None, description="snapshot_id of the entry")


def _uuid_field(name: str, value: str | None) -> uuid.UUID | None:
    if value is None:
        return None
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise Failure(f"{name} must be a UUID (got {value!r})") from exc


@op
def requeue_quarantined_snapshot_detach(
    context: OpExecutionContext, config: RequeueConfig, database: DatabaseResource
) -> None:
    """Runbook (DET-7): Quarantined → Pending with attempts 0, due now."""
    try:
        entry_id = requeue_quarantined(
            database.get_engine(),
            entry_id=_uuid_field("entry_id", config.entry_id),
            snapshot_id=_uuid_field("snapshot_id", config.snapshot_id),
        )
    except RequeueError as exc:
        raise Failure(str(exc)) from exc
    context.log.info(f"re-enqueued snapshot-detach entry {entry_id}")


@job(
    name="news_snapshot_detach_requeue",
    executor_def=in_process_executor,
    description="Runbook: re-enqueue a Quarantined snapshot-detach entry (config: entry_id "
    "or snapshot_id). Quarantined entries: `pin detach status`.",
)
def news_snapshot_detach_requeue() -> None:
    requeue_quarantined_snapshot_detach()
