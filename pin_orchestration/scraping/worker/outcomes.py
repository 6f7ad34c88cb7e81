"""What a worker run's slots decided, written by its main loop: one transaction per round,
kept in memory through a database outage, and tallied in the run's report."""

from __future__ import annotations

import logging
import queue
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from sqlalchemy import Engine

from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.leases import AttemptOutcome
from pin_orchestration.scraping.store.results import ResultStore
from pin_orchestration.scraping.worker.backoff import DatabaseBackoff

log = logging.getLogger(__name__)


@dataclass
class DayReport:
    """What a run wrote for one day's partition of scraping/results."""

    jobs_stored: int = 0
    bytes: int = 0
    failures_by_class: Counter[str] = field(default_factory=Counter)


@dataclass
class WorkerReport:
    worker: str
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    lease_lost: int = 0
    peak_in_flight: int = 0
    by_day: dict[date, DayReport] = field(default_factory=dict)

    def day(self, d: date) -> DayReport:
        return self.by_day.setdefault(d, DayReport())


def drain_outcomes(
    outcomes: queue.Queue[tuple[AttemptOutcome, datetime]],
    unwritten: list[tuple[AttemptOutcome, datetime]],
) -> None:
    while True:
        try:
            unwritten.append(outcomes.get_nowait())
        except queue.Empty:
            return


def write_outcomes(
    engine: Engine,
    worker: str,
    store: ResultStore,
    unwritten: list[tuple[AttemptOutcome, datetime]],
    report: WorkerReport,
    clock: Callable[[], datetime],
    database: DatabaseBackoff,
    max_pause_seconds: float,
) -> bool:
    """Write the outcomes owed (one transaction); True when written. On a database error
    they stay in `unwritten` for the next try."""
    try:
        written = leases.finish_attempts(
            engine,
            worker=worker,
            outcomes=[o for o, _ in unwritten],
            clock=clock,
            max_pause_seconds=max_pause_seconds,
        )
        refused = [o for o, _ in unwritten if o.job_id not in written]
        # A refusal may be our own earlier write whose commit was acknowledged too late
        # (the connection cut after COMMIT): the attempt row tells.
        landed = leases.attempts_written(engine, [(o.job_id, o.attempt) for o in refused])
    except Exception as exc:
        database.failed(f"writing {len(unwritten)} outcomes", exc)
        return False
    database.succeeded()
    batch, unwritten[:] = list(unwritten), []
    unwanted: list[str] = []
    for outcome, created_at in batch:
        status = written.get(outcome.job_id)
        if status is None and (outcome.job_id, outcome.attempt) in landed:
            status = landed[outcome.job_id, outcome.attempt]
        if status is None:
            report.lease_lost += 1
            if outcome.result_key is not None:
                unwanted.append(outcome.result_key)
            continue
        day = report.day(created_at.astimezone(UTC).date())
        if status == "succeeded":
            report.succeeded += 1
            day.jobs_stored += 1
            day.bytes += outcome.result_size or 0
        elif status == "queued":
            report.retried += 1
        elif status == "failed":
            report.failed += 1
            day.failures_by_class[outcome.error_class or "unknown"] += 1
        elif status == "cancelled":
            report.cancelled += 1
            if outcome.result_key is not None:  # fetched, then overruled by the cancel
                unwanted.append(outcome.result_key)
    if unwanted:
        try:
            store.delete_many(unwanted)
        except Exception:
            log.exception(
                "deleting %d unwanted result objects failed; pin-retention deletes them",
                len(unwanted),
            )
    return True
