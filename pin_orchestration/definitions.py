"""The code location: every area's Dagster definitions, merged, plus shared resources.

An area's sensors live in sensors/<area>.py, its schedules (and the asset jobs they
launch) in schedules/<area>.py, its jobs and ops in jobs/<area>.py, its assets and checks
in assets/<area>.py (docs/layout.md)."""

from __future__ import annotations

from dagster import Definitions, colored_console_logger, definitions, in_process_executor

from pin_orchestration.assets.alert_checks import no_failed_runs_check
from pin_orchestration.assets.analyst import (
    BUILDING_FREE_SHARE,
    DRIFT_BY_POST_STATUS,
    SCRAPING_DAILY_OUTCOMES,
    daily_drift_by_post_status,
    project_building_free_share,
    scraping_daily_outcomes,
)
from pin_orchestration.assets.chessboard import (
    DRAIN_JOB,
    PROJECT_AGGREGATES,
    RECALC_HEALTH,
    aggregates_match_source_of_truth,
    no_poison_recalc_requests,
    project_aggregates,
)
from pin_orchestration.assets.chessboard_health import RECALC_HEALTH_CHECKS, recalc_health
from pin_orchestration.assets.news_reconcile import (
    RECONCILE_HEALTH,
    comment_reconcile_health,
    no_failed_runs_in_26h,
    post_comment_counts,
    reconciled_within_26h,
)
from pin_orchestration.assets.news_snapshot_detach import (
    OUTBOX_ASSET_KEY,
    OUTBOX_CHECKS,
    snapshot_detach_outbox,
)
from pin_orchestration.assets.scraping import WORKER_JOB, scraping_results
from pin_orchestration.assets.scraping_health import JOBS_HEALTH, JOBS_HEALTH_CHECKS, jobs_health
from pin_orchestration.jobs.chessboard import (
    chessboard_divergence_check,
    chessboard_force_recalc,
    chessboard_project_recalc_drain,
    chessboard_publish_outbox,
    chessboard_reset_poison_row,
)
from pin_orchestration.jobs.locks import pin_release_lock
from pin_orchestration.jobs.news_snapshot_detach import (
    news_snapshot_detach_requeue,
    news_snapshot_detach_retry,
)
from pin_orchestration.jobs.retention import pin_retention_job
from pin_orchestration.jobs.scraping import (
    scraping_requeue,
    scraping_sweep_expired_leases,
    scraping_webhook_delivery,
    scraping_worker,
)
from pin_orchestration.news.snapshot_detach.policy import DETACH_JOB
from pin_orchestration.platform.settings import Settings
from pin_orchestration.resources.analyst_io import ParquetFrameIOManager, PostgresAssetReader
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.scraping import ScrapingResource
from pin_orchestration.resources.selections import SelectionsResource
from pin_orchestration.schedules.alerts import (
    pin_alert_checks_every_5_minutes,
    pin_alert_checks_job,
)
from pin_orchestration.schedules.news_reconcile import (
    build_full_sweep_schedule,
    news_comment_reconcile_daily,
    news_comment_reconcile_health_hourly,
    news_comment_reconcile_health_job,
    news_comment_reconcile_job,
)
from pin_orchestration.schedules.retention import pin_retention
from pin_orchestration.schedules.scraping import scraping_stuck_sweeper
from pin_orchestration.sensors.analyst import pin_analyst_automation
from pin_orchestration.sensors.chessboard import chessboard_project_recalc_sensor
from pin_orchestration.sensors.news_snapshot_detach import news_snapshot_detach_outbox_sensor
from pin_orchestration.sensors.run_failures import asset_job_code, record_failed_runs
from pin_orchestration.sensors.scraping import scraping_jobs_sensor, scraping_webhooks_sensor


def news_comment_reconcile_definitions(settings: Settings) -> Definitions:
    return Definitions(
        assets=[post_comment_counts, comment_reconcile_health],
        asset_checks=[
            reconciled_within_26h,
            no_failed_runs_in_26h,
            # The analysts' drift frame of the reconcile's days (its own runs: automation).
            no_failed_runs_check(
                RECONCILE_HEALTH, [asset_job_code(DRIFT_BY_POST_STATUS.to_user_string())]
            ),
        ],
        jobs=[news_comment_reconcile_job, news_comment_reconcile_health_job],
        schedules=[
            news_comment_reconcile_daily,
            build_full_sweep_schedule(settings.news_full_sweep_cron),
            news_comment_reconcile_health_hourly,
        ],
    )


def chessboard_project_recalc_definitions() -> Definitions:
    return Definitions(
        assets=[project_aggregates, recalc_health],
        asset_checks=[
            aggregates_match_source_of_truth,
            no_poison_recalc_requests,
            *RECALC_HEALTH_CHECKS,
            no_failed_runs_check(
                RECALC_HEALTH,
                [
                    DRAIN_JOB.code,
                    asset_job_code(PROJECT_AGGREGATES.to_user_string()),
                    asset_job_code(BUILDING_FREE_SHARE.to_user_string()),
                ],
            ),
        ],
        jobs=[
            chessboard_project_recalc_drain,
            chessboard_force_recalc,
            chessboard_divergence_check,
            chessboard_reset_poison_row,
            chessboard_publish_outbox,
        ],
        sensors=[chessboard_project_recalc_sensor],
    )


def news_snapshot_detach_definitions() -> Definitions:
    return Definitions(
        assets=[snapshot_detach_outbox],
        asset_checks=[*OUTBOX_CHECKS, no_failed_runs_check(OUTBOX_ASSET_KEY, [DETACH_JOB.code])],
        jobs=[news_snapshot_detach_retry, news_snapshot_detach_requeue],
        sensors=[news_snapshot_detach_outbox_sensor],
        resources={"selections": SelectionsResource()},
    )


def scraping_definitions() -> Definitions:
    return Definitions(
        # Worker runs materialize it; analysts load a day's jobs through the reader.
        assets=[scraping_results.with_io_manager_key("pin_postgres_reader"), jobs_health],
        asset_checks=[
            *JOBS_HEALTH_CHECKS,
            no_failed_runs_check(
                JOBS_HEALTH,
                [WORKER_JOB.code, asset_job_code(SCRAPING_DAILY_OUTCOMES.to_user_string())],
            ),
        ],
        jobs=[
            scraping_worker,
            scraping_sweep_expired_leases,
            scraping_requeue,
            scraping_webhook_delivery,
        ],
        sensors=[scraping_jobs_sensor, scraping_webhooks_sensor],
        schedules=[scraping_stuck_sweeper],
        resources={"scraping": ScrapingResource()},
    )


def retention_definitions() -> Definitions:
    return Definitions(jobs=[pin_retention_job], schedules=[pin_retention])


def build_definitions(settings: Settings | None = None) -> Definitions:
    settings = settings or Settings.from_env()
    return Definitions.merge(
        Definitions(
            resources={
                "database": DatabaseResource(),
                "pin_postgres_reader": PostgresAssetReader(),
                "pin_frames": ParquetFrameIOManager(),
            },
            assets=[
                daily_drift_by_post_status,
                project_building_free_share,
                scraping_daily_outcomes,
            ],
            sensors=[record_failed_runs, pin_analyst_automation],
            jobs=[pin_alert_checks_job, pin_release_lock],
            schedules=[pin_alert_checks_every_5_minutes],
            # Also the implicit asset job's, which UI backfills and automation launch: one
            # Python start per run like the named jobs, not one more per step (on a busy
            # host each start is seconds the run queue waits on).
            executor=in_process_executor,
            loggers={
                "console": colored_console_logger.configured({"log_level": settings.run_log_level})
            },
        ),
        news_comment_reconcile_definitions(settings),
        chessboard_project_recalc_definitions(),
        news_snapshot_detach_definitions(),
        scraping_definitions(),
        retention_definitions(),
    )


@definitions
def defs() -> Definitions:
    """The code location, built when Dagster loads it, not when this module is imported:
    the environment (e.g. PIN_NEWS_FULL_SWEEP_CRON) is read then."""
    return build_definitions()
