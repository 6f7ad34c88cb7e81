"""`news_snapshot_detach_outbox_sensor`: launches `news_snapshot_detach_retry` runs
(jobs/news_snapshot_detach.py) while due Pending rows exist, and reports the outbox's alert
checks whenever their outcome changes.

Each evaluation is one cheap query (`monitoring.sensor_state`, ix_sdo_due). At most one
drain run is launched per polling window (PIN_SNAPSHOT_DETACH_POLLING_SECONDS, default
5 min, read at evaluation time); its run_key is the window, so a window never gets two
runs."""

import json
from datetime import UTC, datetime

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from pin_orchestration.assets.news_snapshot_detach import check_evaluations
from pin_orchestration.jobs.news_snapshot_detach import news_snapshot_detach_retry
from pin_orchestration.news.snapshot_detach.monitoring import demo_quarantined_ids, sensor_state
from pin_orchestration.news.snapshot_detach.policy import DETACH_JOB
from pin_orchestration.platform.settings import Settings
from pin_orchestration.resources.database import DatabaseResource


def _now() -> datetime:
    return datetime.now(UTC)


@sensor(
    name="news_snapshot_detach_outbox_sensor",
    job=news_snapshot_detach_retry,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Launches one drain run per polling window while due Pending rows exist.",
)
def news_snapshot_detach_outbox_sensor(
    context: SensorEvaluationContext, database: DatabaseResource
) -> SensorResult:
    interval = Settings.from_env().snapshot_detach_polling_seconds
    now = _now()
    engine = database.get_engine()
    state = sensor_state(engine)
    cursor = json.loads(context.cursor) if context.cursor else {}

    demo_ids = demo_quarantined_ids(engine) if state.quarantined else []
    evaluations = check_evaluations(state, demo_ids)
    alerts = {e.check_name: e.passed for e in evaluations}
    asset_events = evaluations if alerts != cursor.get("alerts") else []

    window_start = int(now.timestamp() // interval * interval)
    run_requests: list[RunRequest] = []
    skip: SkipReason | None = None
    if state.due == 0:
        skip = SkipReason("no due Pending rows in news.snapshot_detach_outbox")
    elif cursor.get("window_start") == window_start:
        skip = SkipReason(
            f"{state.due} rows due; this polling window ({interval:g} s) already has its run"
        )
    else:
        window = datetime.fromtimestamp(window_start, UTC).isoformat()
        run_requests.append(
            RunRequest(
                run_key=f"{DETACH_JOB.code}:{window}",
                tags={"pin/due_rows": str(state.due), "pin/polling_window": window},
            )
        )
        cursor = {**cursor, "window_start": window_start}
    return SensorResult(
        run_requests=run_requests,
        skip_reason=skip,
        asset_events=asset_events,
        cursor=json.dumps({**cursor, "alerts": alerts}),
    )
