"""Queue alerts without Dagster: a backlog whose oldest due item waits longer than a drain
would ever let it (nothing is taking work: sensor off, drains failing, daemon down), and
scraping jobs running past their lease (a worker died; the sweeper should return them).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, TextClause, text

from pin_orchestration.sql import load_queries

# A drain takes due work within a sensor tick or two (chessboard: event → aggregates p99
# ~40 s; scraping: 95 % of jobs start within a minute); ten minutes is no run at all.
STALLED_AFTER = timedelta(minutes=10)


@dataclass(frozen=True)
class Backlog:
    due: int
    oldest_due: datetime | None

    def stalled(self, now: datetime, after: timedelta = STALLED_AFTER) -> bool:
        return self.oldest_due is not None and now - self.oldest_due > after

    def oldest_age_seconds(self, now: datetime) -> float:
        return (now - self.oldest_due).total_seconds() if self.oldest_due else 0.0


def _query(name: str) -> TextClause:
    return text(load_queries("pin_orchestration", "queue_health.sql")[name])


def chessboard_backlog(engine: Engine) -> Backlog:
    with engine.connect() as conn:
        row = conn.execute(_query("chessboard_due_backlog")).one()
    return Backlog(due=row.due, oldest_due=row.oldest_due)


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
