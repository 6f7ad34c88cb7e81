"""Dagster wiring of news-snapshot-detach-retry (seed 001): the outbox as an asset with its
alert checks (the jobs are in `pin_orchestration.jobs.news_snapshot_detach`).

The work itself is in the `pin_orchestration.news.snapshot_detach` package; this module only turns
config into options, resources into an engine and a client, and results into events.
"""

# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at decoration time.

from datetime import UTC, datetime

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetSpec,
    multi_asset_check,
)
from dagster import AssetCheckSpec as CheckSpec

from pin_orchestration.news.snapshot_detach.monitoring import (
    STALLED_AFTER_SECONDS,
    SensorState,
    sensor_state,
)
from pin_orchestration.resources.database import DatabaseResource

OUTBOX_ASSET_KEY = AssetKey(["news", "snapshot_detach_outbox"])
QUARANTINE_CHECK = "no_quarantined_entries"
STALLED_CHECK = "worker_not_stalled"

snapshot_detach_outbox = AssetSpec(
    OUTBOX_ASSET_KEY,
    description="news.snapshot_detach_outbox: detach intents of orphaned selection snapshots "
    "(written by set-blocks / delete-post, drained by news_snapshot_detach_retry).",
    group_name="news",
    kinds={"postgres"},
)


def check_evaluations(state: SensorState, now: datetime) -> list[AssetCheckEvaluation]:
    """The two alert checks of the outbox as evaluations (reported by the sensor and runs)."""
    stalled = state.stalled(now)
    return [
        AssetCheckEvaluation(
            asset_key=OUTBOX_ASSET_KEY,
            check_name=QUARANTINE_CHECK,
            passed=state.quarantined == 0,
            severity=AssetCheckSeverity.ERROR,
            description=(
                f"SnapshotDetachQuarantinedEvent: {state.quarantined} entries Quarantined — "
                "read last_error, fix the cause, then run news_snapshot_detach_requeue "
                "or `pin detach requeue`"
                if state.quarantined
                else "no Quarantined entries"
            ),
            metadata={"quarantined": state.quarantined},
        ),
        AssetCheckEvaluation(
            asset_key=OUTBOX_ASSET_KEY,
            check_name=STALLED_CHECK,
            passed=not stalled,
            severity=AssetCheckSeverity.ERROR,
            description=(
                f"rows due for over {STALLED_AFTER_SECONDS // 60} min and no successful "
                "run since: check the sensor, the lock holder (`pin locks list`) and selections"
                if stalled
                else "due rows are being worked"
            ),
            metadata={
                "due": state.due,
                "oldest_due": str(state.oldest_due) if state.oldest_due else "",
                "last_success": str(state.last_success) if state.last_success else "",
            },
        ),
    ]


@multi_asset_check(
    specs=[
        CheckSpec(QUARANTINE_CHECK, asset=OUTBOX_ASSET_KEY, description="No entry is Quarantined"),
        CheckSpec(
            STALLED_CHECK,
            asset=OUTBOX_ASSET_KEY,
            description="No row due for over 15 min without a successful run",
        ),
    ],
)
def snapshot_detach_outbox_checks(database: DatabaseResource):
    """Run on demand from the UI; the sensor reports the same evaluations on every change."""
    state = sensor_state(database.get_engine())
    for evaluation in check_evaluations(state, datetime.now(UTC)):
        yield AssetCheckResult(
            check_name=evaluation.check_name,
            asset_key=evaluation.asset_key,
            passed=evaluation.passed,
            severity=evaluation.severity,
            description=evaluation.description,
            metadata=evaluation.metadata,
        )
