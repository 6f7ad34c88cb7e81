"""`pin_alert_checks_every_5_minutes` and the job it launches, `pin_alert_checks`: every
area's health asset observed and its alert checks evaluated in one run, so their status on
the asset pages is never older than a few minutes.

An asset job (no op of its own: it selects every area's health asset), so it sits here
with the schedule that launches it, as an area's asset jobs sit in schedules/<area>.py.
The health assets are in assets/<area>_health.py (and the outbox's in
assets/news_snapshot_detach.py); they read the queue figures through `queue_health.py` /
`chessboard/queue.py` from their named queries."""

from __future__ import annotations

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    ScheduleDefinition,
    define_asset_job,
    in_process_executor,
)

from pin_orchestration.assets.chessboard import RECALC_HEALTH
from pin_orchestration.assets.news_reconcile import RECONCILE_HEALTH
from pin_orchestration.assets.news_snapshot_detach import OUTBOX_ASSET_KEY
from pin_orchestration.assets.scraping_health import JOBS_HEALTH

# Selecting an asset selects its checks: every alert of the area comes with it.
HEALTH_ASSETS = (RECONCILE_HEALTH, OUTBOX_ASSET_KEY, RECALC_HEALTH, JOBS_HEALTH)

pin_alert_checks_job = define_asset_job(
    "pin_alert_checks",
    selection=AssetSelection.assets(*HEALTH_ASSETS),
    executor_def=in_process_executor,
    description="The areas' health assets observed and their alert checks evaluated: "
    "stalled backlogs, SLOs, errors growing, recalc poison, quarantined detaches "
    "(docs/runbooks.md)",
)

pin_alert_checks_every_5_minutes = ScheduleDefinition(
    name="pin_alert_checks_every_5_minutes",
    job=pin_alert_checks_job,
    cron_schedule="*/5 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Evaluates pin_alert_checks every 5 minutes",
)
