"""Schedules of news-comment-reconcile (REC-1) and the asset jobs they launch: the daily
window at 03:00 Moscow and the full sweep on PIN_NEWS_FULL_SWEEP_CRON launch
`news_comment_reconcile`, the hourly alert checks `news_comment_reconcile_health`.

An asset job has no op of its own: it selects the asset, so it sits here with what
launches it. It materializes `news/post_comment_counts` (assets/news_reconcile.py), whose
body calls `news.reconcile.run_reconcile` with the named queries of `news/reconcile.sql`."""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    define_asset_job,
    in_process_executor,
    schedule,
)

from pin_orchestration.assets.news_reconcile import POST_COMMENT_COUNTS, RECONCILE_HEALTH
from pin_orchestration.news.reconcile import RECONCILE_JOB, Scope

news_comment_reconcile_job = define_asset_job(
    RECONCILE_JOB.name,
    selection=AssetSelection.assets(POST_COMMENT_COUNTS),
    executor_def=in_process_executor,
    tags=RECONCILE_JOB.tags,
    description="Reconcile news.posts.comments_count (seed 000). Config: scope, batch_size, "
    "max_run_duration_seconds, window_lookback_hours, lock_ttl_seconds, drift_alert_threshold",
)

news_comment_reconcile_health_job = define_asset_job(
    "news_comment_reconcile_health",
    # The health asset observed, then its checks (selected with it).
    selection=AssetSelection.assets(RECONCILE_HEALTH),
    executor_def=in_process_executor,
    description="Alert checks: a successful reconcile within 26 h, no failed runs",
)


MOSCOW = ZoneInfo("Europe/Moscow")


def reconcile_run_request(context: ScheduleEvaluationContext, scope: Scope) -> RunRequest:
    """The run for the day before the tick (Moscow time), with the given scope."""
    tick = context.scheduled_execution_time.astimezone(MOSCOW)
    partition_key = (tick - timedelta(days=1)).date().isoformat()
    return RunRequest(
        partition_key=partition_key,
        run_config={"ops": {"news__post_comment_counts": {"config": {"scope": scope.value}}}},
        tags={"pin/scope": scope.value},
    )


@schedule(
    name="news_comment_reconcile_daily",
    job=news_comment_reconcile_job,
    cron_schedule="0 3 * * *",
    execution_timezone="Europe/Moscow",
    default_status=DefaultScheduleStatus.RUNNING,
    description="03:00 Moscow: DailyWindow reconcile of the previous day's activity",
)
def news_comment_reconcile_daily(context: ScheduleEvaluationContext) -> RunRequest:
    return reconcile_run_request(context, Scope.DAILY_WINDOW)


def build_full_sweep_schedule(cron: str) -> ScheduleDefinition:
    @schedule(
        name="news_comment_reconcile_full_sweep",
        job=news_comment_reconcile_job,
        cron_schedule=cron,
        execution_timezone="Europe/Moscow",
        default_status=DefaultScheduleStatus.RUNNING,
        description="FullSweep reconcile of every non-archived post (PIN_NEWS_FULL_SWEEP_CRON)",
    )
    def news_comment_reconcile_full_sweep(context: ScheduleEvaluationContext) -> RunRequest:
        return reconcile_run_request(context, Scope.FULL_SWEEP)

    return news_comment_reconcile_full_sweep


news_comment_reconcile_health_hourly = ScheduleDefinition(
    name="news_comment_reconcile_health_hourly",
    job=news_comment_reconcile_health_job,
    cron_schedule="17 * * * *",
    execution_timezone="Europe/Moscow",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Hourly evaluation of the reconcile alert checks",
)
