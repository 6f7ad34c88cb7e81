"""`pin_alert_checks`: the state-based alert checks of every area in one run, on a schedule,
so their status on the asset pages is never older than a few minutes."""

from __future__ import annotations

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    ScheduleDefinition,
    define_asset_job,
    in_process_executor,
)

from pin_orchestration.assets.chessboard import no_poison_recalc_requests
from pin_orchestration.assets.news_snapshot_detach import snapshot_detach_outbox_checks
from pin_orchestration.assets.queue_checks import QUEUE_CHECKS

pin_alert_checks_job = define_asset_job(
    "pin_alert_checks",
    selection=AssetSelection.checks(
        *QUEUE_CHECKS, no_poison_recalc_requests, snapshot_detach_outbox_checks
    ),
    executor_def=in_process_executor,
    description="Alert checks over the queues: stalled backlogs, jobs past their lease, "
    "recalc poison, quarantined detaches (docs/runbooks.md)",
)

pin_alert_checks_every_5_minutes = ScheduleDefinition(
    name="pin_alert_checks_every_5_minutes",
    job=pin_alert_checks_job,
    cron_schedule="*/5 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Evaluates pin_alert_checks every 5 minutes",
)
