"""Dagster wiring of news-snapshot-detach-retry (seed 001): the outbox as an asset with its
alert checks (the jobs are in `pin_orchestration.jobs.news_snapshot_detach`).

The work itself is in the `pin_orchestration.news.snapshot_detach` package; this module only turns
config into options, resources into an engine and a client, and results into events.
"""

# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at decoration time.

import uuid
from collections.abc import Iterator

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetSpec,
    Config,
    ObserveResult,
    asset_check,
    multi_asset_check,
    multi_observable_source_asset,
)
from dagster import AssetCheckSpec as CheckSpec
from pydantic import Field
from sqlalchemy import Engine

from pin_orchestration.coordination.queue_health import detach_failed_calls_since
from pin_orchestration.news.snapshot_detach.monitoring import (
    DEMO_QUARANTINE_NOTE,
    STALLED_AFTER_SECONDS,
    SensorState,
    demo_quarantined_ids,
    outbox_state,
    sensor_state,
)
from pin_orchestration.news.snapshot_detach.policy import DETACH_JOB
from pin_orchestration.resources.database import DatabaseResource

OUTBOX_ASSET_KEY = AssetKey(["news", "snapshot_detach_outbox"])
QUARANTINE_CHECK = "no_quarantined_entries"
STALLED_CHECK = "worker_not_stalled"


# Observable, so its page and the asset graph show the last observation (each drain run
# and pin_alert_checks record one), not "Never materialized": nothing materializes a queue.
@multi_observable_source_asset(
    specs=[
        AssetSpec(
            OUTBOX_ASSET_KEY,
            description="news.snapshot_detach_outbox: detach intents of orphaned selection "
            "snapshots (written by set-blocks / delete-post, drained by "
            "news_snapshot_detach_retry). Observed by every drain run and by pin_alert_checks.",
            group_name="news",
            kinds={"postgres"},
        )
    ],
)
def snapshot_detach_outbox(database: DatabaseResource) -> Iterator[ObserveResult]:
    state = outbox_state(database.get_engine())
    yield ObserveResult(
        asset_key=OUTBOX_ASSET_KEY,
        metadata={
            "pending": state.pending,
            "quarantined": state.quarantined,
            "oldest_age_seconds": round(state.oldest_age_seconds, 1),
        },
    )


def outbox_evaluations(engine: Engine) -> list[AssetCheckEvaluation]:
    """The outbox's state-change alerts, evaluated now (the sensor and drain runs report
    them; the demo's deliberate quarantines are named as such)."""
    state = sensor_state(engine)
    demo_ids = demo_quarantined_ids(engine) if state.quarantined else []
    return check_evaluations(state, demo_ids)


def _quarantine_description(quarantined: int, demo_ids: list[uuid.UUID]) -> str:
    if not quarantined:
        return "no Quarantined entries"
    description = (
        f"SnapshotDetachQuarantinedEvent: {quarantined} entries Quarantined — "
        "read last_error, fix the cause, then run news_snapshot_detach_requeue "
        "or `pin detach requeue ENTRY_ID`"
    )
    if demo_ids:
        commands = "; ".join(f"`pin detach requeue {entry}`" for entry in demo_ids)
        description += f". {len(demo_ids)} of them: {DEMO_QUARANTINE_NOTE} ({commands})"
    return description


def check_evaluations(
    state: SensorState, demo_ids: list[uuid.UUID] | None = None
) -> list[AssetCheckEvaluation]:
    """The two state-change alerts of the outbox as evaluations, by the database's clock
    (`state.now`); `demo_ids`: the Quarantined entries the demo made on purpose."""
    stalled = state.stalled()
    demo_ids = demo_ids or []
    return [
        AssetCheckEvaluation(
            asset_key=OUTBOX_ASSET_KEY,
            check_name=QUARANTINE_CHECK,
            passed=state.quarantined == 0,
            severity=AssetCheckSeverity.ERROR,
            description=_quarantine_description(state.quarantined, demo_ids),
            metadata={
                "quarantined": state.quarantined,
                **({"demo": DEMO_QUARANTINE_NOTE} if demo_ids else {}),
                **({"demo_entry_ids": ", ".join(map(str, demo_ids))} if demo_ids else {}),
            },
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
    """Run by pin_alert_checks and on demand; the sensor reports the same evaluations on
    every change."""
    for evaluation in outbox_evaluations(database.get_engine()):
        yield AssetCheckResult(
            check_name=evaluation.check_name,
            asset_key=evaluation.asset_key,
            passed=evaluation.passed,
            severity=evaluation.severity,
            description=evaluation.description,
            metadata=evaluation.metadata,
        )


class PendingAlertConfig(Config):
    max_oldest_age_seconds: float = Field(
        default=3600,
        gt=0,
        description="The oldest Pending entry older than this fails (steady state: Pending "
        "≈ 0; the owner detaches at once and the job retries within minutes)",
    )


@asset_check(
    asset=OUTBOX_ASSET_KEY,
    name="pending_not_growing",
    description="Pending / oldest age growing: no Pending entry older than "
    "max_oldest_age_seconds (1 h): the job or selections is not keeping up",
)
def pending_not_growing(
    context: AssetCheckExecutionContext, config: PendingAlertConfig, database: DatabaseResource
) -> AssetCheckResult:
    state = outbox_state(database.get_engine())
    growing = state.oldest_age_seconds > config.max_oldest_age_seconds
    return AssetCheckResult(
        passed=not growing,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"{state.pending} Pending, the oldest {state.oldest_age_seconds:.0f} s old "
            f"(> {config.max_oldest_age_seconds:g} s): is selections answering "
            "(`pin detach status`, last_error) and is the drain running?"
            if growing
            else f"{state.pending} Pending, none older than {config.max_oldest_age_seconds:g} s"
        ),
        metadata={
            "pending": state.pending,
            "oldest_age_seconds": round(state.oldest_age_seconds, 1),
            "max_oldest_age_seconds": config.max_oldest_age_seconds,
        },
    )


class FailedCallsAlertConfig(Config):
    window_seconds: float = Field(default=900, gt=0, description="failed calls counted over")
    max_failed_calls: int = Field(
        default=10, ge=0, description="more failed detach calls than this in the window fail"
    )


@asset_check(
    asset=OUTBOX_ASSET_KEY,
    name="no_failed_calls_spike",
    description="Failed calls spike: news_snapshot_detach_failed_total (5xx, timeouts, "
    "network errors of the selections client) rose by at most max_failed_calls in the last "
    "window_seconds",
)
def no_failed_calls_spike(
    context: AssetCheckExecutionContext, config: FailedCallsAlertConfig, database: DatabaseResource
) -> AssetCheckResult:
    failed = detach_failed_calls_since(
        database.get_engine(), DETACH_JOB.code, config.window_seconds
    )
    spike = failed > config.max_failed_calls
    return AssetCheckResult(
        passed=not spike,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"{failed} detach calls failed in the last {config.window_seconds:g} s: "
            "selections is failing; read last_error (`pin detach status`)"
            if spike
            else f"{failed} failed detach calls in the last {config.window_seconds:g} s"
        ),
        metadata={
            "failed_calls": failed,
            "window_seconds": config.window_seconds,
            "max_failed_calls": config.max_failed_calls,
        },
    )


OUTBOX_CHECKS = [snapshot_detach_outbox_checks, pending_not_growing, no_failed_calls_spike]
