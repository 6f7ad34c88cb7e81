"""Alerts without Dagster, read from PostgreSQL so any process can evaluate them: scraping
jobs due or running past their lease, the scraping SLOs, failed detach calls, and how an
alert compares two observations of a counter or histogram (the chessboard recalc figures
it compares are read by pin_orchestration/chessboard/metrics.py: seed 002, p99 over the
SLO, runs_total{result=error} growing, liveness).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries

# A drain takes due work within a sensor tick or two (scraping: 95 % of jobs start within a
# minute); ten minutes is no run at all.
STALLED_AFTER = timedelta(minutes=10)


@dataclass(frozen=True)
class Backlog:
    due: int
    oldest_due: datetime | None

    def stalled(self, now: datetime, after: timedelta = STALLED_AFTER) -> bool:
        return self.oldest_due is not None and now - self.oldest_due > after

    def oldest_age_seconds(self, now: datetime) -> float:
        return (now - self.oldest_due).total_seconds() if self.oldest_due else 0.0


_query = NamedQueries("pin_orchestration.coordination", "queue_health.sql")


def scraping_backlog(engine: Engine) -> Backlog:
    with engine.connect() as conn:
        row = conn.execute(_query("scraping_due_backlog")).one()
    return Backlog(due=row.due, oldest_due=row.oldest_due)


@dataclass(frozen=True)
class PastLease:
    count: int
    oldest_expiry: datetime | None


def scraping_jobs_past_lease(engine: Engine) -> PastLease:
    with engine.connect() as conn:
        row = conn.execute(_query("scraping_jobs_past_lease")).one()
    return PastLease(count=row.past_lease, oldest_expiry=row.oldest_expiry)


@dataclass(frozen=True)
class SloWindow:
    """Jobs an SLO is measured over, and how many of them met it."""

    jobs: int
    met: int

    @property
    def share(self) -> float | None:
        return self.met / self.jobs if self.jobs else None

    def meets(self, objective: float) -> bool:
        """No job in the window is no evidence of a miss."""
        return self.share is None or self.share >= objective


def lowest_uuid7_at(at: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of `at`'s millisecond: every id minted since compares above it."""
    return uuid.UUID(int=int(at.timestamp() * 1000) << 80)


def _slo_window(engine: Engine, name: str, now: datetime, **params: float) -> SloWindow:
    window = timedelta(seconds=params["window_seconds"] + 60)  # ids minted a bit earlier too
    with engine.connect() as conn:
        row = conn.execute(
            _query(name), {"lowest_id": lowest_uuid7_at(now - window), **params}
        ).one()
    return SloWindow(jobs=row.jobs, met=row.met)


def scraping_start_slo(
    engine: Engine, *, now: datetime, window_seconds: float, start_within_seconds: float
) -> SloWindow:
    return _slo_window(
        engine,
        "scraping_start_slo",
        now,
        window_seconds=window_seconds,
        start_within_seconds=start_within_seconds,
    )


def scraping_terminal_slo(
    engine: Engine, *, now: datetime, window_seconds: float, settle_seconds: float
) -> SloWindow:
    return _slo_window(
        engine,
        "scraping_terminal_slo",
        now,
        window_seconds=window_seconds,
        settle_seconds=settle_seconds,
    )


def detach_failed_calls_since(engine: Engine, job_code: str, window_seconds: float) -> int:
    with engine.connect() as conn:
        row = conn.execute(
            _query("detach_failed_calls_since"),
            {"job_code": job_code, "window_seconds": window_seconds},
        ).one()
    return int(row.failed_calls)


def quantile_upper_bound(cumulative: Mapping[str, float], quantile: float) -> float | None:
    """The smallest bucket bound holding `quantile` of the observations of a cumulative
    Prometheus histogram ({le: count}, "+Inf" included), as histogram_quantile bounds it;
    None without observations."""
    total = cumulative.get("+Inf", 0.0)
    if total <= 0:
        return None
    for bound, count in sorted((float(le), n) for le, n in cumulative.items()):
        if count >= quantile * total:
            return bound
    return float("inf")


def counter_increase(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """now - before per key; a counter that went down was reset, so it counts from zero."""
    increase = {k: v - before.get(k, 0.0) for k, v in now.items()}
    return dict(now) if any(v < 0 for v in increase.values()) else increase
