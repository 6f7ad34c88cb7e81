"""What the sensor, the alert checks, `pin detach status` and the metrics read: the outbox's
state, the quarantined entries, and the DET-6 figures (all from PostgreSQL: runs are
short-lived processes)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from pin_orchestration.coordination.jobruns import last_successful_run_at
from pin_orchestration.news.snapshot_detach.outbox import query
from pin_orchestration.news.snapshot_detach.policy import DETACH_JOB

# Seed alert: no successful run for more than 15 min (while work is due).
STALLED_AFTER_SECONDS = 15 * 60
# The mark of an entry the demo (`pin demo seed`, devstack/demo.py) quarantined on purpose:
# its last_error starts with DEMO_ERROR_PREFIX, and the alert checks and `pin up` name such
# entries with DEMO_QUARANTINE_NOTE, so nobody chases them. Here, where the checks read it;
# the demo imports it to write it.
DEMO_ERROR_PREFIX = "DEMO: "
DEMO_QUARANTINE_NOTE = "demo: quarantined on purpose; `pin detach requeue …` clears it"


@dataclass(frozen=True)
class SensorState:
    # The database's time of the reading: due times and run ends are the database's too,
    # so a daemon whose clock drifts cannot make the outbox look stalled (or not).
    now: datetime
    due: int
    oldest_due: datetime | None  # the earliest next_attempt_at among Pending rows
    quarantined: int
    last_success: datetime | None

    def stalled(self) -> bool:
        """Rows have been due for over 15 min and no run succeeded in that time."""
        limit = self.now - timedelta(seconds=STALLED_AFTER_SECONDS)
        overdue = self.due > 0 and self.oldest_due is not None and self.oldest_due < limit
        return overdue and (self.last_success is None or self.last_success < limit)


def sensor_state(engine: Engine) -> SensorState:
    with engine.connect() as conn:
        row = conn.execute(query("sensor_state")).one()
    return SensorState(
        now=row.now,
        due=row.due,
        oldest_due=row.oldest_due,
        quarantined=row.quarantined,
        last_success=last_successful_run_at(engine, DETACH_JOB.code),
    )


@dataclass(frozen=True)
class OutboxState:
    pending: int
    quarantined: int
    oldest_age_seconds: float


def outbox_state(engine: Engine) -> OutboxState:
    with engine.connect() as conn:
        row = conn.execute(query("outbox_state")).one()
    return OutboxState(
        pending=row.pending,
        quarantined=row.quarantined,
        oldest_age_seconds=float(row.oldest_age_seconds),
    )


def quarantined_entries(engine: Engine, limit: int = 20) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(r._mapping) for r in conn.execute(query("quarantined_entries"), {"limit": limit})
        ]


def demo_quarantined_ids(engine: Engine) -> list[uuid.UUID]:
    """The Quarantined entries the demo made on purpose (still Quarantined)."""
    with engine.connect() as conn:
        return list(
            conn.execute(query("demo_quarantined_ids"), {"prefix": DEMO_ERROR_PREFIX}).scalars()
        )


# Buckets (seconds) of news_snapshot_detach_lag_seconds: created_at → Done.
LAG_BUCKETS_SECONDS = (1, 10, 60, 300, 600, 1800, 3600, 7200, 21600, 86400)


@dataclass(frozen=True)
class MetricsSnapshot:
    """DET-6 figures, all read from PostgreSQL (runs are short-lived processes)."""

    state: OutboxState
    # Totals over every recorded run (pin.job_runs results).
    succeeded: int
    retried: int
    failed: int
    quarantined: int
    # Cumulative Done counts per LAG_BUCKETS_SECONDS bound, then the count and sum.
    lag_buckets: list[tuple[float, int]]
    lag_count: int
    lag_sum_seconds: float


def read_metrics(engine: Engine) -> MetricsSnapshot:
    state = outbox_state(engine)
    with engine.connect() as conn:
        totals = conn.execute(query("run_totals"), {"job_code": DETACH_JOB.code}).one()
        buckets = conn.execute(
            query("done_lag_histogram"), {"bounds": [float(b) for b in LAG_BUCKETS_SECONDS]}
        ).all()
        lag = conn.execute(query("done_lag_totals")).one()
    return MetricsSnapshot(
        state=state,
        succeeded=totals.succeeded,
        retried=totals.retried,
        failed=totals.failed,
        quarantined=totals.quarantined,
        lag_buckets=[(float(b.upper_bound), b.cumulative_count) for b in buckets],
        lag_count=lag.count,
        lag_sum_seconds=float(lag.sum_seconds),
    )


class SnapshotDetachCollector(Collector):
    """news_snapshot_detach_* (seed 001, DET-6)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        m = read_metrics(self.engine)
        yield GaugeMetricFamily(
            "news_snapshot_detach_pending", "Pending backlog of the outbox", value=m.state.pending
        )
        yield GaugeMetricFamily(
            "news_snapshot_detach_oldest_age_seconds",
            "now - min(created_at) over Pending entries",
            value=m.state.oldest_age_seconds,
        )
        for name, value, doc in (
            ("retried", m.retried, "Failed detach calls left Pending for another attempt"),
            ("succeeded", m.succeeded, "Entries detached (Done)"),
            ("failed", m.failed, "Detach calls that failed (5xx, timeout, network, rejected)"),
            ("quarantined", m.quarantined, "Entries moved to Quarantined"),
        ):
            yield CounterMetricFamily(f"news_snapshot_detach_{name}", doc, value=value)
        lag = HistogramMetricFamily(
            "news_snapshot_detach_lag_seconds", "created_at → Done of detached entries"
        )
        lag.add_metric(
            [],
            [(f"{bound:g}", count) for bound, count in m.lag_buckets] + [("+Inf", m.lag_count)],
            sum_value=m.lag_sum_seconds,
        )
        yield lag
