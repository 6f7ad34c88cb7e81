"""The scraping service's health asset and its alerts: the queue not stalled, no job past
its lease, and the seed's SLOs (004: 95 % of jobs start within a minute, 99 % reach a
terminal state without a human)."""

# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at definition time.

from collections.abc import Iterator
from datetime import UTC, datetime

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetSpec,
    Config,
    ObserveResult,
    asset_check,
    multi_observable_source_asset,
)
from pydantic import Field

from pin_orchestration.assets.alert_checks import last_successful_run
from pin_orchestration.assets.scraping import WORKER_JOB
from pin_orchestration.coordination.queue_health import (
    STALLED_AFTER,
    SloWindow,
    scraping_backlog,
    scraping_jobs_past_lease,
    scraping_start_slo,
    scraping_terminal_slo,
)
from pin_orchestration.resources.database import DatabaseResource

JOBS_HEALTH = AssetKey(["scraping", "jobs_health"])


@multi_observable_source_asset(
    specs=[
        AssetSpec(
            JOBS_HEALTH,
            group_name="scraping",
            kinds={"postgres"},
            description="The scraping queue as pin_alert_checks observes it every 5 minutes; "
            "its checks are the queue alerts and the seed's SLOs.",
        )
    ],
)
def jobs_health(database: DatabaseResource) -> Iterator[ObserveResult]:
    engine = database.get_engine()
    now = datetime.now(UTC)
    backlog = scraping_backlog(engine)
    past = scraping_jobs_past_lease(engine)
    yield ObserveResult(
        asset_key=JOBS_HEALTH,
        metadata={
            "due": backlog.due,
            "oldest_due_age_seconds": round(backlog.oldest_age_seconds(now), 1),
            "past_lease": past.count,
        },
    )


@asset_check(
    asset=JOBS_HEALTH,
    name="scraping_queue_not_stalled",
    description="No queued scraping job due for over 10 min (backlog / oldest age growing, "
    "no worker run taking it)",
)
def scraping_queue_not_stalled(
    context: AssetCheckExecutionContext, database: DatabaseResource
) -> AssetCheckResult:
    now = datetime.now(UTC)
    backlog = scraping_backlog(database.get_engine())
    stalled = backlog.stalled(now)
    return AssetCheckResult(
        passed=not stalled,
        severity=AssetCheckSeverity.ERROR,
        description=(
            f"{backlog.due} due, the oldest waiting {backlog.oldest_age_seconds(now):.0f} s "
            f"(> {STALLED_AFTER.total_seconds():.0f} s): check scraping_jobs_sensor is "
            "running and the last worker runs' logs (docs/runbooks.md#scraping-queue-stalled)"
            if stalled
            else f"{backlog.due} due, none waiting too long"
        ),
        metadata={
            "due": backlog.due,
            "oldest_age_seconds": round(backlog.oldest_age_seconds(now), 1),
            f"last_successful_{WORKER_JOB.name}_run": last_successful_run(
                context.instance, WORKER_JOB.name
            ),
        },
    )


@asset_check(
    asset=JOBS_HEALTH,
    name="no_jobs_past_lease",
    description="No scraping job is running past its lease (its worker died; the "
    "scraping_stuck_sweeper schedule returns such jobs to the queue every minute)",
)
def no_jobs_past_lease(
    context: AssetCheckExecutionContext, database: DatabaseResource
) -> AssetCheckResult:
    past = scraping_jobs_past_lease(database.get_engine())
    return AssetCheckResult(
        passed=past.count == 0,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"{past.count} running past their lease: run scraping_sweep_expired_leases "
            "or `pin scraping sweep` (docs/runbooks.md#scraping-jobs-past-their-lease)"
            if past.count
            else "no job past its lease"
        ),
        metadata={
            "past_lease": past.count,
            "oldest_expiry": past.oldest_expiry.isoformat() if past.oldest_expiry else "",
        },
    )


def _slo_result(name: str, window: SloWindow, objective: float, hint: str) -> AssetCheckResult:
    share = window.share
    passed = window.meets(objective)
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"no job in the window for {name}"
            if share is None
            else f"{share:.1%} of {window.jobs} jobs {name} (objective {objective:.0%})"
            + ("" if passed else f": {hint}")
        ),
        metadata={
            "jobs": window.jobs,
            "met": window.met,
            "share": round(share, 4) if share is not None else -1.0,
            "objective": objective,
        },
    )


class StartSloConfig(Config):
    objective: float = Field(default=0.95, gt=0, le=1, description="SLO: 95 % of jobs")
    start_within_seconds: float = Field(default=60, gt=0, description="start within 1 min")
    window_seconds: float = Field(default=3600, gt=0, description="jobs accepted this recently")


@asset_check(
    asset=JOBS_HEALTH,
    name="jobs_start_within_a_minute",
    description="SLO: 95 % of jobs start within a minute (over the jobs accepted in the "
    "last window_seconds)",
)
def jobs_start_within_a_minute(
    context: AssetCheckExecutionContext, config: StartSloConfig, database: DatabaseResource
) -> AssetCheckResult:
    window = scraping_start_slo(
        database.get_engine(),
        now=datetime.now(UTC),
        window_seconds=config.window_seconds,
        start_within_seconds=config.start_within_seconds,
    )
    return _slo_result(
        f"started within {config.start_within_seconds:g} s",
        window,
        config.objective,
        "the worker pool does not keep up: raise PIN_SCRAPING_SLOTS or the runs' "
        "concurrency limit, look for a busy domain (docs/runbooks.md#scraping-queue-stalled)",
    )


class TerminalSloConfig(Config):
    objective: float = Field(default=0.99, gt=0, le=1, description="SLO: 99 % of jobs")
    window_seconds: float = Field(default=86400, gt=0, description="jobs accepted this recently")
    settle_seconds: float = Field(
        default=3600, gt=0, description="a job younger than this may still be retrying"
    )


@asset_check(
    asset=JOBS_HEALTH,
    name="jobs_terminal_without_a_human",
    description="SLO: 99 % of accepted jobs reach a terminal state (succeeded, failed, "
    "cancelled) without a human requeueing them",
)
def jobs_terminal_without_a_human(
    context: AssetCheckExecutionContext, config: TerminalSloConfig, database: DatabaseResource
) -> AssetCheckResult:
    window = scraping_terminal_slo(
        database.get_engine(),
        now=datetime.now(UTC),
        window_seconds=config.window_seconds,
        settle_seconds=config.settle_seconds,
    )
    return _slo_result(
        "reached a terminal state without a human",
        window,
        config.objective,
        "look for jobs left running (no_jobs_past_lease) and the failures humans "
        "requeued (`pin scraping failed`)",
    )


JOBS_HEALTH_CHECKS = [
    scraping_queue_not_stalled,
    no_jobs_past_lease,
    jobs_start_within_a_minute,
    jobs_terminal_without_a_human,
]
