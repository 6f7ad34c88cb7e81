"""Dagster wiring of news-comment-reconcile: the asset, its run config and its checks."""
# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at definition time.

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    Config,
    DailyPartitionsDefinition,
    Failure,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    ObserveResult,
    asset,
    asset_check,
    multi_observable_source_asset,
)
from pydantic import Field

from pin_orchestration.coordination.cancellation import stop_requested_on_signals
from pin_orchestration.coordination.jobruns import RunStatus as JobRunStatus
from pin_orchestration.coordination.jobruns import count_runs_since, last_successful_run_at
from pin_orchestration.coordination.locks import default_holder
from pin_orchestration.news.reconcile import (
    RECONCILE_JOB,
    ReconcileConfigError,
    ReconcileOptions,
    ReconcileResult,
    RunStatus,
    run_reconcile,
)
from pin_orchestration.platform.options import dagster_config
from pin_orchestration.resources.analyst_io import PostgresAssetReader
from pin_orchestration.resources.database import DatabaseResource

POST_COMMENT_COUNTS = AssetKey(RECONCILE_JOB.asset)
# Unpartitioned, so the run-history alerts show their state on its page (on the daily asset
# they read "Not evaluated" once another day is materialized).
RECONCILE_HEALTH = AssetKey(["news", "comment_reconcile_health"])
DRIFT_CHECK = "drift_within_threshold"
# The seed's alert: no successful run for more than 26 hours.
STALE_AFTER_SECONDS = 26 * 3600

# end_offset=1: the running Moscow day is a partition, so a reconcile launched today (FullSweep
# on demand, a Launchpad run) records under today and its window ends now; the 03:00
# schedule still reconciles the day before.
news_daily_partitions = DailyPartitionsDefinition(
    start_date="2025-01-01", timezone="Europe/Moscow", fmt="%Y-%m-%d", end_offset=1
)


# news_comment_reconcile_daily runs at 03:00 Moscow (a run ends within its 20 min max
# duration): a day not materialized by 04:00 shows as late on the asset's page. The drift
# frame, which follows it, declares the same.
DAILY_RECONCILE_FRESHNESS = FreshnessPolicy.cron(
    deadline_cron="0 4 * * *", lower_bound_delta=timedelta(hours=1), timezone="Europe/Moscow"
)


ReconcileConfig = dagster_config(
    ReconcileOptions, "ReconcileConfig", "Run config of news-comment-reconcile (seed 000)"
)


def _result_metadata(result: ReconcileResult) -> dict[str, object]:
    summary = result.summary()
    metadata: dict[str, object] = {k: v for k, v in summary.items() if v is not None}
    if result.corrections:
        rows = "\n".join(
            f"| {c['post_id']} | {c['from']} | {c['to']} |" for c in result.corrections
        )
        metadata["corrections"] = MetadataValue.md(
            f"| post_id | from | to |\n|---|---|---|\n{rows}"
        )
    return metadata


@asset(
    key=POST_COMMENT_COUNTS,
    partitions_def=news_daily_partitions,
    check_specs=[
        AssetCheckSpec(
            DRIFT_CHECK,
            asset=POST_COMMENT_COUNTS,
            description="Drift corrected in the run stays at or under drift_alert_threshold; "
            "more points at a bug in the hot-path increment (INV-CMT-005)",
        )
    ],
    output_required=False,
    freshness_policy=DAILY_RECONCILE_FRESHNESS,
    # One reconcile at a time across every kind of run (schedule, Launchpad, backfill):
    # dagster.yaml gives pools a limit of 1 at run granularity, so overlapping runs wait in
    # the queue instead of skipping on the distributed lock.
    pool=RECONCILE_JOB.name,
    # Analysts load a day's value (its reconcile runs) as a DataFrame from PostgreSQL.
    # Bundled, so any Definitions holding the asset (tests, subsets) can load it.
    io_manager_def=PostgresAssetReader(),
    group_name="news",
    kinds={"postgres"},
    description="news.posts.comments_count reconciled to the number of Visible comments "
    "(seed 000). A partition is a day in Europe/Moscow; its DailyWindow looks back "
    "from the end of that day.",
)
def post_comment_counts(
    context: AssetExecutionContext, config: ReconcileConfig, database: DatabaseResource
) -> Iterator[MaterializeResult | AssetCheckResult]:
    options: ReconcileOptions = config.to_options()  # type: ignore[attr-defined]
    try:
        options.validate()
    except ReconcileConfigError as exc:
        raise Failure(description=str(exc)) from exc
    window_end = context.partition_time_window.end if context.has_partition_key else None
    anchor = min(datetime.now(UTC), window_end) if window_end else None
    run_id = context.run.run_id
    # A SIGTERM (Dagster terminating the run) stops the run between slices; leaving this
    # block delivers it to Dagster, which ends the step interrupted: a cancelled run
    # materializes nothing, whatever it committed.
    with stop_requested_on_signals(reraise=True) as stop:
        result = run_reconcile(
            database.get_engine(),
            options,
            run_id=run_id,
            holder=default_holder(run_id),
            window_anchor=anchor,
            partition=context.partition_key if context.has_partition_key else None,
            stop_requested=stop,
            logger=context.log,
        )
    if result.status == RunStatus.SKIPPED:
        # Lock held by another runner: the run succeeds (seed), nothing is materialized, and
        # the check says the day was skipped, not that it passed: its work is owed.
        yield AssetCheckResult(
            check_name=DRIFT_CHECK,
            passed=False,
            severity=AssetCheckSeverity.WARN,
            description=f"skipped: lock held by {result.lock_holder or 'another runner'}; "
            "this day's work is owed to the next run (owed_posts; a FullSweep's pass stays "
            "pending), which reconciles it whatever its window",
            metadata={
                "skipped": "lock held",
                "lock_key": RECONCILE_JOB.lock_key,
                "lock_holder": result.lock_holder or "",
                "owed_posts": result.owed_posts,
                "backlog_remaining": result.backlog_remaining,
            },
        )
        return
    if result.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        # CANCELLED here: stopped without a signal to deliver (none is sent otherwise).
        raise Failure(
            description=f"{RECONCILE_JOB.code} {result.status.value}: {result.error or 'stopped'}; "
            "committed batches stay, the rest is owed to the next run",
            metadata=_result_metadata(result),
        )
    yield MaterializeResult(
        metadata=_result_metadata(result),
        check_results=[
            AssetCheckResult(
                check_name=DRIFT_CHECK,
                passed=result.drift_corrected <= options.drift_alert_threshold,
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "drift_corrected": result.drift_corrected,
                    "drift_alert_threshold": options.drift_alert_threshold,
                },
            )
        ],
    )


@multi_observable_source_asset(
    specs=[
        AssetSpec(
            RECONCILE_HEALTH,
            group_name="news",
            kinds={"postgres"},
            description="The reconcile's run history as the hourly health job and "
            "pin_alert_checks observe it; its checks are the seed's alerts (no successful run "
            "for 26 h, errors growing). The per-run drift alert is on post_comment_counts.",
        )
    ],
)
def comment_reconcile_health(database: DatabaseResource) -> Iterator[ObserveResult]:
    engine = database.get_engine()
    last = last_successful_run_at(engine, RECONCILE_JOB.code)
    yield ObserveResult(
        asset_key=RECONCILE_HEALTH,
        metadata={
            "last_success_at": last.isoformat() if last else "never",
            "failed_runs_26h": count_runs_since(
                engine, RECONCILE_JOB.code, JobRunStatus.FAILED, STALE_AFTER_SECONDS
            ),
        },
    )


class ReconcileStaleAlertConfig(Config):
    max_age_hours: float = Field(
        default=STALE_AFTER_SECONDS / 3600, gt=0, description="no successful run for 26 h"
    )


@asset_check(
    asset=RECONCILE_HEALTH,
    name="reconciled_within_26h",
    description="A reconcile run succeeded within the last 26 hours (max_age_hours)",
)
def reconciled_within_26h(
    context: AssetCheckExecutionContext,
    config: ReconcileStaleAlertConfig,
    database: DatabaseResource,
) -> AssetCheckResult:
    last = last_successful_run_at(database.get_engine(), RECONCILE_JOB.code)
    age = (datetime.now(UTC) - last).total_seconds() if last else None
    return AssetCheckResult(
        passed=age is not None and age <= config.max_age_hours * 3600,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "last_success_at": last.isoformat() if last else "never",
            "age_hours": round(age / 3600, 2) if age is not None else -1,
            "max_age_hours": config.max_age_hours,
        },
    )


class ReconcileErrorsAlertConfig(Config):
    window_hours: float = Field(default=26, gt=0, description="failed runs counted over this")
    max_failed_runs: int = Field(default=0, ge=0, description="more failed runs than this fail")


@asset_check(
    asset=RECONCILE_HEALTH,
    name="no_failed_runs_in_26h",
    description="Errors growing: news_comment_reconcile_errors_total rose by more than "
    "max_failed_runs (0) in the last window_hours (26)",
)
def no_failed_runs_in_26h(
    context: AssetCheckExecutionContext,
    config: ReconcileErrorsAlertConfig,
    database: DatabaseResource,
) -> AssetCheckResult:
    failed = count_runs_since(
        database.get_engine(), RECONCILE_JOB.code, JobRunStatus.FAILED, config.window_hours * 3600
    )
    return AssetCheckResult(
        passed=failed <= config.max_failed_runs,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"{failed} reconcile runs failed in the last {config.window_hours:g} h: open them "
            "in Runs (job news_comment_reconcile), fix the cause (docs/runbooks.md#failed-runs)"
            if failed > config.max_failed_runs
            else f"no failed runs in {config.window_hours:g} h"
        ),
        metadata={"failed_runs": failed, "window_hours": config.window_hours},
    )
