"""The chessboard recalc queue's health asset and the seed's alerts on it (seed 002:
CHESSBOARD_RECALC_BACKLOG, process p99 over the SLO, runs_total{result=error} growing,
the worker's liveness; CHESSBOARD_RECALC_POISON is beside the asset in chessboard.py)."""

# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at definition time.

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetSpec,
    Config,
    MetadataValue,
    ObserveResult,
    asset_check,
    multi_observable_source_asset,
)
from pydantic import Field

from pin_orchestration.assets.alert_checks import last_successful_run, observed_before
from pin_orchestration.assets.chessboard import DRAIN_JOB, RECALC_HEALTH
from pin_orchestration.chessboard.metrics import RecalcCounters, chessboard_recalc_counters
from pin_orchestration.chessboard.queue import queue_stats
from pin_orchestration.coordination.queue_health import counter_increase, quantile_upper_bound
from pin_orchestration.resources.database import DatabaseResource

BACKLOG_CHECK = "CHESSBOARD_RECALC_BACKLOG"


@multi_observable_source_asset(
    specs=[
        AssetSpec(
            RECALC_HEALTH,
            group_name="chessboard",
            kinds={"postgres"},
            description="The recalc queue and the drain's counters as pin_alert_checks "
            "observes them every 5 minutes; its checks are the seed's alerts.",
        )
    ],
)
def recalc_health(database: DatabaseResource) -> Iterator[ObserveResult]:
    engine = database.get_engine()
    with engine.connect() as conn:
        stats = queue_stats(conn)
    counters = chessboard_recalc_counters(engine)
    yield ObserveResult(
        asset_key=RECALC_HEALTH,
        metadata={
            "queue_depth": stats.depth,
            "due_backlog": stats.due,
            "poison_rows": stats.poison,
            "oldest_due_age_seconds": round(stats.oldest_due_age_seconds or 0.0, 1),
            "runs_failed_total": counters.failed,
            "process_duration_buckets": MetadataValue.json(counters.duration_buckets),
            "last_tick_at": counters.last_tick_at.isoformat() if counters.last_tick_at else "",
        },
    )


class RecalcBacklogAlertConfig(Config):
    max_oldest_due_seconds: float = Field(
        default=300, gt=0, description="CHESSBOARD_RECALC_BACKLOG: the seed's 5 min"
    )


@asset_check(
    asset=RECALC_HEALTH,
    name=BACKLOG_CHECK,
    description="CHESSBOARD_RECALC_BACKLOG: no recalc request due for over 5 min "
    "(max_oldest_due_seconds): the worker is stuck or falling behind",
)
def chessboard_recalc_backlog(
    context: AssetCheckExecutionContext,
    config: RecalcBacklogAlertConfig,
    database: DatabaseResource,
) -> AssetCheckResult:
    with database.get_engine().connect() as conn:
        stats = queue_stats(conn)
    age = stats.oldest_due_age_seconds or 0.0
    stalled = age > config.max_oldest_due_seconds
    return AssetCheckResult(
        passed=not stalled,
        severity=AssetCheckSeverity.ERROR,
        description=(
            f"{BACKLOG_CHECK}: {stats.due} due, the oldest waiting {age:.0f} s "
            f"(> {config.max_oldest_due_seconds:g} s): check chessboard_project_recalc_sensor "
            "is running and the last drain runs' logs "
            "(docs/runbooks.md#chessboard-recalc-queue-stalled)"
            if stalled
            else f"{stats.due} due, none waiting over {config.max_oldest_due_seconds:g} s"
        ),
        metadata={
            "due_backlog": stats.due,
            "oldest_due_age_seconds": round(age, 1),
            "max_oldest_due_seconds": config.max_oldest_due_seconds,
            f"last_successful_{DRAIN_JOB.name}_run": last_successful_run(
                context.instance, DRAIN_JOB.name
            ),
        },
    )


def _counters_then(
    context: AssetCheckExecutionContext, window_seconds: float
) -> tuple[str, RecalcCounters | None]:
    """The counters the health observation recorded `window_seconds` ago (None: no such
    observation yet, the window is everything since the counters started)."""
    now = datetime.now(UTC)
    then = observed_before(context, RECALC_HEALTH, now - timedelta(seconds=window_seconds))
    if then is None:
        return "the first recorded recalc", None
    at, metadata = then
    buckets = metadata.get("process_duration_buckets")
    return at.isoformat(), RecalcCounters(
        failed=float(metadata.get("runs_failed_total", 0.0)),  # type: ignore[arg-type]
        duration_buckets=dict(buckets) if isinstance(buckets, dict) else {},
        last_tick_at=None,
    )


class ProcessP99AlertConfig(Config):
    slo_seconds: float = Field(default=2.0, gt=0, description="SLO: one project in p99 < 2 s")
    window_seconds: float = Field(default=3600, gt=0, description="p99 over this window")


@asset_check(
    asset=RECALC_HEALTH,
    name="process_p99_within_slo",
    description="process p99 over the SLO: chessboard_recalc_process_duration_seconds p99 "
    "over the last window_seconds at or under slo_seconds (2 s)",
)
def process_p99_within_slo(
    context: AssetCheckExecutionContext, config: ProcessP99AlertConfig, database: DatabaseResource
) -> AssetCheckResult:
    now = chessboard_recalc_counters(database.get_engine())
    since, then = _counters_then(context, config.window_seconds)
    window = counter_increase(now.duration_buckets, then.duration_buckets if then else {})
    p99 = quantile_upper_bound(window, 0.99)
    passed = p99 is None or p99 <= config.slo_seconds
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.WARN,
        description=(
            "no recalc in the window"
            if p99 is None
            else f"p99 <= {p99:g} s over {window.get('+Inf', 0):.0f} recalcs since {since} "
            f"(SLO {config.slo_seconds:g} s)"
        ),
        metadata={
            "p99_upper_bound_seconds": p99 if p99 is not None else -1.0,
            "recalcs": window.get("+Inf", 0.0),
            "since": since,
            "slo_seconds": config.slo_seconds,
        },
    )


class RecalcErrorsAlertConfig(Config):
    window_seconds: float = Field(default=900, gt=0, description="errors counted over this")
    max_errors: int = Field(default=0, ge=0, description="more failed recalcs than this fail")


@asset_check(
    asset=RECALC_HEALTH,
    name="recalc_errors_not_growing",
    description="runs_total{result=error} growing: no more than max_errors failed project "
    "recalcs in the last window_seconds",
)
def recalc_errors_not_growing(
    context: AssetCheckExecutionContext, config: RecalcErrorsAlertConfig, database: DatabaseResource
) -> AssetCheckResult:
    now = chessboard_recalc_counters(database.get_engine())
    since, then = _counters_then(context, config.window_seconds)
    errors = now.failed - then.failed if then and now.failed >= then.failed else now.failed
    return AssetCheckResult(
        passed=errors <= config.max_errors,
        severity=AssetCheckSeverity.WARN,
        description=(
            f"{errors:.0f} project recalcs failed since {since}: read last_error of the "
            "queue rows (`pin chessboard status`) and the drain runs' logs"
            if errors > config.max_errors
            else f"no failed recalcs since {since}"
        ),
        metadata={"failed_recalcs": errors, "since": since, "max_errors": config.max_errors},
    )


class RecalcLivenessAlertConfig(Config):
    tick_interval_seconds: float = Field(
        default=30,
        gt=0,
        description="How long due work may wait for a drain tick: the sensor's 5 s plus a "
        "run's start (DAGSTER-NOTES: 3-19 s)",
    )


@asset_check(
    asset=RECALC_HEALTH,
    name="recalc_worker_alive",
    description="Liveness: while recalc requests are due, a drain ticked (or, in a long "
    "tick, beat) within two tick_interval_seconds "
    "(chessboard_recalc_last_tick_timestamp_seconds grows)",
)
def recalc_worker_alive(
    context: AssetCheckExecutionContext,
    config: RecalcLivenessAlertConfig,
    database: DatabaseResource,
) -> AssetCheckResult:
    engine = database.get_engine()
    with engine.connect() as conn:
        stats = queue_stats(conn)
    counters = chessboard_recalc_counters(engine)
    last_tick = counters.last_tick_at
    # Both ages by the database's clock: the due times and the tick times are its own.
    tick_age = counters.last_tick_age_seconds
    limit = 2 * config.tick_interval_seconds
    waiting = (stats.oldest_due_age_seconds or 0.0) > limit
    silent = tick_age is None or tick_age > limit
    return AssetCheckResult(
        passed=not (waiting and silent),
        severity=AssetCheckSeverity.ERROR,
        description=(
            f"no drain tick for over {limit:g} s while {stats.due} requests are due: is "
            "chessboard_project_recalc_sensor running, and the daemon?"
            if waiting and silent
            else "a drain ticks while work is due"
        ),
        metadata={
            "last_tick_at": last_tick.isoformat() if last_tick else "never",
            "due_backlog": stats.due,
            "two_intervals_seconds": limit,
        },
    )


RECALC_HEALTH_CHECKS = [
    chessboard_recalc_backlog,
    process_p99_within_slo,
    recalc_errors_not_growing,
    recalc_worker_alive,
]
