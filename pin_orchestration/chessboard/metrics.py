"""The seed's metrics (AGG-8), for Prometheus.

Gauges are read from the queue and the outbox when scraped. Counters and the duration
histogram live in chessboard.recalc_metrics, incremented once per drain tick (a
separate small transaction, so N workers do not serialize on counter rows while they
recalculate): drain runs are short-lived processes and keep nothing in memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine

from pin_orchestration.chessboard.outcomes import ProjectOutcome
from pin_orchestration.chessboard.queue import (
    DEFAULT_POLICY,
    DRAIN_IDLE_SECONDS,
    RecalcPolicy,
    query,
    queue_stats,
)
from pin_orchestration.coordination.locks import end_transaction_idle_past

# Buckets of chessboard_recalc_process_duration_seconds (SLO: p99 < 2 s per project).
DURATION_BUCKETS: Sequence[float] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
RUNS = "runs_total"
COALESCED = "coalesced_events_total"
REPUBLISHED = "republished_total"
DURATION_BUCKET = "process_duration_bucket"
DURATION_SUM = "process_duration_sum"
DURATION_COUNT = "process_duration_count"
LAST_TICK = "last_tick"
LOCK_CONFLICTS = "lock_conflicts_total"


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def record_outcomes(engine: Engine, outcomes: Iterable[ProjectOutcome]) -> None:
    """Add one tick's outcomes to the persisted counters (and mark the worker alive)."""
    increments: Counter[tuple[str, str]] = Counter()
    increments[(LAST_TICK, "")] += 0  # upserted even for an empty tick: liveness
    for o in outcomes:
        increments[(RUNS, o.result)] += 1
        if o.result != "failed":
            increments[(COALESCED, "")] += o.requested_count
        if o.recalc is not None:
            for entity, n in o.recalc.republished.items():
                increments[(REPUBLISHED, entity)] += n
        for bound in (*DURATION_BUCKETS, float("inf")):
            if o.duration_seconds <= bound:
                increments[(DURATION_BUCKET, _le(bound))] += 1
        increments[(DURATION_SUM, "")] += o.duration_seconds
        increments[(DURATION_COUNT, "")] += 1
    with engine.begin() as conn:
        add_metrics(conn, {k: float(v) for k, v in increments.items()})


def record_heartbeat(engine: Engine) -> None:
    """Mark the worker alive in the middle of a tick (LAST_TICK's time, nothing counted): a
    tick of many slow projects outlasts the liveness check's window."""
    with engine.begin() as conn:
        add_metrics(conn, {(LAST_TICK, ""): 0.0})


def add_metrics(conn: Connection, increments: Mapping[tuple[str, str], float]) -> None:
    """Add to persisted counters (name, label) in the caller's transaction, which PostgreSQL
    ends if it idles DRAIN_IDLE_SECONDS: every drain's outcomes wait for these rows."""
    end_transaction_idle_past(conn, DRAIN_IDLE_SECONDS)
    keys = list(increments)
    conn.execute(
        query("add_metric"),
        {
            "names": [k[0] for k in keys],
            "labels": [k[1] for k in keys],
            "values": [increments[k] for k in keys],
        },
    )


class ChessboardRecalcCollector(Collector):
    """prometheus-client custom collector: one read of PostgreSQL per scrape."""

    def __init__(self, engine: Engine, policy: RecalcPolicy = DEFAULT_POLICY) -> None:
        self.engine = engine
        self._policy = policy

    def collect(self) -> Iterator[Metric]:
        with self.engine.connect() as conn:
            stats = queue_stats(conn, policy=self._policy)
            outbox = conn.execute(query("outbox_stats")).one()
            rows = conn.execute(query("read_metrics")).all()
        values = {(r.name, r.label): r.value for r in rows}
        tick_at = next((r.updated_at for r in rows if r.name == LAST_TICK), None)

        yield GaugeMetricFamily(
            "chessboard_recalc_queue_depth",
            "Rows in chessboard.project_recalc_requests",
            value=stats.depth,
        )
        yield GaugeMetricFamily(
            "chessboard_recalc_due_backlog",
            "Queue rows with due_at <= now (not poison)",
            value=stats.due,
        )
        yield GaugeMetricFamily(
            "chessboard_recalc_poison_rows",
            "Queue rows at attempt_count >= poison threshold (CHESSBOARD_RECALC_POISON)",
            value=stats.poison,
        )
        yield GaugeMetricFamily(
            "chessboard_recalc_oldest_due_age_seconds",
            "How long the oldest due row has been due, poison rows left out (0 when none)",
            value=stats.oldest_due_age_seconds or 0.0,
        )
        yield GaugeMetricFamily(
            "chessboard_recalc_last_tick_timestamp_seconds",
            "When a drain tick last started, beat (at most once a tick_seconds while it "
            "works) or recorded its outcome (liveness)",
            value=tick_at.timestamp() if tick_at else 0.0,
        )
        runs = CounterMetricFamily(
            "chessboard_recalc_runs",
            "Projects processed by the drain, by result",
            labels=["result"],
        )
        for result in ("recalculated", "skipped", "failed"):
            runs.add_metric([result], values.get((RUNS, result), 0.0))
        yield runs
        yield CounterMetricFamily(
            "chessboard_recalc_lock_conflicts",
            "Recalcs given up at once on a row a raiser's transaction held; the project is "
            "retried later, no attempt counted",
            value=values.get((LOCK_CONFLICTS, ""), 0.0),
        )
        yield CounterMetricFamily(
            "chessboard_recalc_coalesced_events",
            "Recalc requests served by drained rows (sum of requested_count)",
            value=values.get((COALESCED, ""), 0.0),
        )
        republished = CounterMetricFamily(
            "chessboard_recalc_republished",
            "Snapshot events written to the outbox",
            labels=["entity"],
        )
        for entity in ("project", "layout", "layout_group"):
            republished.add_metric([entity], values.get((REPUBLISHED, entity), 0.0))
        yield republished
        yield HistogramMetricFamily(
            "chessboard_recalc_process_duration_seconds",
            "Time to recalculate one project (claim to commit)",
            buckets=[
                (_le(b), values.get((DURATION_BUCKET, _le(b)), 0.0))
                for b in (*DURATION_BUCKETS, float("inf"))
            ],
            sum_value=values.get((DURATION_SUM, ""), 0.0),
        )
        yield GaugeMetricFamily(
            "chessboard_outbox_pending",
            "Outbox events not yet acknowledged by the broker",
            value=outbox.pending,
        )
        yield GaugeMetricFamily(
            "chessboard_outbox_oldest_pending_age_seconds",
            "Delivery lag of pin.chessboard.*-upserted.v1: age of the oldest unpublished event",
            value=float(outbox.oldest_pending_age_seconds or 0.0),
        )


# What the alert checks compare between two observations (coordination/queue_health.py:
# quantile_upper_bound, counter_increase).
@dataclass(frozen=True)
class RecalcCounters:
    """The chessboard drain's persisted counters (chessboard.recalc_metrics)."""

    failed: float  # chessboard_recalc_runs_total{result="failed"}
    duration_buckets: dict[str, float]  # chessboard_recalc_process_duration_seconds, {le: n}
    last_tick_at: datetime | None
    # Seconds since the last tick by the database's clock (None: never ticked).
    last_tick_age_seconds: float | None = None


def chessboard_recalc_counters(engine: Engine) -> RecalcCounters:
    with engine.connect() as conn:
        rows = conn.execute(query("read_metrics")).all()
    tick = next((r for r in rows if r.name == LAST_TICK), None)
    return RecalcCounters(
        failed=next((r.value for r in rows if (r.name, r.label) == (RUNS, "failed")), 0.0),
        duration_buckets={r.label: r.value for r in rows if r.name == DURATION_BUCKET},
        last_tick_at=tick.updated_at if tick else None,
        last_tick_age_seconds=(tick.read_at - tick.updated_at).total_seconds() if tick else None,
    )
