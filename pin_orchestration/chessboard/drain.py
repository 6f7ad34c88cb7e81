"""The drain worker's tick (seed 002, AGG-2 and AGG-6).

A tick takes up to `batch_size` due rows, oldest due first, one at a time: each row is
claimed `FOR UPDATE SKIP LOCKED` in its own transaction, which recalculates the project
and deletes the row — counter updates, outbox rows and the queue-row delete commit
together. A row another worker holds is skipped without waiting, so N workers share the
queue and a project is never recalculated twice for one request. A request raised while
the row is held waits for the commit and then inserts a fresh row (nothing is lost).

A failing project rolls back alone; its row stays (due_at unchanged) with attempt_count
+ 1 and last_error, and is retried on a later tick; at `poison_threshold` attempts it
raises CHESSBOARD_RECALC_POISON and is left for manual handling (runbook reset). A stop
request is honoured between projects: the current one commits or rolls back whole.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from sqlalchemy import Engine

from pin_orchestration.chessboard.metrics import record_outcomes
from pin_orchestration.chessboard.queue import DEFAULT_POLICY, RecalcPolicy, query, queue_stats
from pin_orchestration.chessboard.recalc import RecalcResult, recalc_project

POISON_ALERT = "CHESSBOARD_RECALC_POISON"
LAST_ERROR_MAX = 1024

log = logging.getLogger(__name__)

Result = Literal["recalculated", "skipped", "failed"]


@dataclass(frozen=True)
class ProjectOutcome:
    project_id: uuid.UUID
    tenant_id: uuid.UUID
    result: Result
    duration_seconds: float
    requested_count: int
    last_reason: str
    recalc: RecalcResult | None = None
    error: str | None = None
    attempt_count: int = 0
    poisoned: bool = False


@dataclass
class TickResult:
    outcomes: list[ProjectOutcome] = field(default_factory=list)
    stopped: bool = False

    def count(self, result: Result) -> int:
        return sum(1 for o in self.outcomes if o.result == result)

    @property
    def poisoned(self) -> list[ProjectOutcome]:
        return [o for o in self.outcomes if o.poisoned]


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:LAST_ERROR_MAX]


def process_next_due(
    engine: Engine,
    *,
    now: datetime | None = None,
    policy: RecalcPolicy = DEFAULT_POLICY,
    skip: list[uuid.UUID] | None = None,
) -> ProjectOutcome | None:
    """Claim, recalculate and delete one due row in one transaction; None when none is due
    (or every due row is held by another worker)."""
    started = time.perf_counter()
    claimed = None
    try:
        with engine.begin() as conn:
            claimed = conn.execute(
                query("claim_next_due"),
                {"now": now, "poison_threshold": policy.poison_threshold, "skip": skip or []},
            ).first()
            if claimed is None:
                return None
            recalc = recalc_project(conn, claimed.project_id, claimed.tenant_id)
            conn.execute(query("delete_request"), {"project_id": claimed.project_id})
    except Exception as exc:
        if claimed is None:
            raise
        return _record_failure(engine, claimed, exc, started, policy)

    outcome = ProjectOutcome(
        project_id=claimed.project_id,
        tenant_id=claimed.tenant_id,
        result="skipped" if recalc.skipped else "recalculated",
        duration_seconds=time.perf_counter() - started,
        requested_count=claimed.requested_count,
        last_reason=claimed.last_reason,
        recalc=recalc,
        attempt_count=claimed.attempt_count,
    )
    if recalc.skipped:
        log.info(
            "project_skipped_archived project_id=%s reason=%s",
            claimed.project_id,
            recalc.skip_reason,
        )
    else:
        log.info(
            "project_recalculated project_id=%s tenant_id=%s duration_ms=%.1f republished=%s",
            claimed.project_id,
            claimed.tenant_id,
            outcome.duration_seconds * 1000,
            recalc.republished,
        )
    return outcome


def _record_failure(
    engine: Engine, claimed, exc: Exception, started: float, policy: RecalcPolicy
) -> ProjectOutcome:
    """After the rollback: attempt_count + 1 and last_error, in a transaction of its own."""
    error = _error_text(exc)
    with engine.begin() as conn:
        attempts = conn.execute(
            query("record_failure"), {"project_id": claimed.project_id, "error": error}
        ).scalar()
    attempts = attempts if attempts is not None else claimed.attempt_count + 1
    poisoned = attempts >= policy.poison_threshold
    log.error(
        "project_recalc_failed project_id=%s attempt_count=%s error=%s",
        claimed.project_id,
        attempts,
        error,
    )
    if poisoned:
        log.error(
            "%s project_id=%s attempt_count=%s: left in the queue for manual handling "
            "(runbook: fix, then `pin chessboard reset-poison %s`); last_error=%s",
            POISON_ALERT,
            claimed.project_id,
            attempts,
            claimed.project_id,
            error,
        )
    return ProjectOutcome(
        project_id=claimed.project_id,
        tenant_id=claimed.tenant_id,
        result="failed",
        duration_seconds=time.perf_counter() - started,
        requested_count=claimed.requested_count,
        last_reason=claimed.last_reason,
        error=error,
        attempt_count=attempts,
        poisoned=poisoned,
    )


def drain_tick(
    engine: Engine,
    *,
    now: datetime | None = None,
    policy: RecalcPolicy = DEFAULT_POLICY,
    should_stop: Callable[[], bool] = lambda: False,
    on_outcome: Callable[[ProjectOutcome], None] | None = None,
    exclude: Collection[uuid.UUID] = (),
) -> TickResult:
    """One worker tick: up to `policy.batch_size` due projects, each its own transaction.

    `exclude` names projects not to claim (a long drain run passes the ones that already
    failed in it, so a failing row is retried on a later tick, not in a tight loop).
    """
    policy.validate()
    with engine.connect() as conn:
        due = queue_stats(conn, now=now, policy=policy).due
    tick = TickResult()
    if due == 0:
        return tick
    log.info("recalc_batch_started size=%d", min(due, policy.batch_size))
    tried: list[uuid.UUID] = list(exclude)
    while len(tick.outcomes) < policy.batch_size:
        if should_stop():
            tick.stopped = True
            log.info("recalc_batch_cancelled after %d projects", len(tick.outcomes))
            break
        outcome = process_next_due(engine, now=now, policy=policy, skip=tried)
        if outcome is None:
            break
        tried.append(outcome.project_id)
        tick.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    record_outcomes(engine, tick.outcomes)
    return tick


def force_recalc_project(engine: Engine, project_id: uuid.UUID) -> RecalcResult:
    """Recalculate one project now, whatever the queue says (Dagster backfill of a
    partition). A pending queue row is waited for, covered and deleted in the same
    transaction."""
    with engine.begin() as conn:
        request = conn.execute(query("lock_request"), {"project_id": project_id}).first()
        recalc = recalc_project(conn, project_id, request.tenant_id if request else None)
        if request is not None:
            conn.execute(query("delete_request"), {"project_id": project_id})
    log.info(
        "project_force_recalculated project_id=%s republished=%s", project_id, recalc.republished
    )
    return recalc
