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

`drain_loop` runs passes back to back and, between them, sleeps until the next row falls
due (one min(due_at) query) instead of a blind tick: a row due just after a pass is taken
within `floor_seconds`, not up to a whole tick later. The sleep is bounded above by the
tick (a row queued meanwhile by another process is still seen within a tick) and below by
the floor (a due row held by another worker must not make this one spin).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from sqlalchemy import Connection, Engine

from pin_orchestration.chessboard.metrics import record_outcomes
from pin_orchestration.chessboard.queue import (
    DEFAULT_POLICY,
    RecalcConfigError,
    RecalcPolicy,
    query,
    queue_stats,
)
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


@dataclass(frozen=True)
class WakePolicy:
    """Bounds of the sleep between drain passes."""

    # Upper bound: the seed's 5 s tick, so requests queued meanwhile are seen within it.
    tick_seconds: float = 5.0
    # Lower bound: a due row held by another worker (SKIP LOCKED skips it, min(due_at)
    # still sees it) must not turn the loop into a busy spin.
    floor_seconds: float = 0.05

    def validate(self) -> None:
        if not 0 < self.floor_seconds <= self.tick_seconds:
            raise RecalcConfigError(
                f"need 0 < floor_seconds ({self.floor_seconds}) <= tick_seconds "
                f"({self.tick_seconds})"
            )


DEFAULT_WAKE = WakePolicy()


def seconds_until_next_due(
    conn: Connection,
    *,
    now: datetime | None = None,
    policy: RecalcPolicy = DEFAULT_POLICY,
    exclude: Collection[uuid.UUID] = (),
) -> float | None:
    """Seconds until the next claimable row is due (<= 0: due already); None when none is
    queued. Poison rows and `exclude` are left out, as the claim leaves them out."""
    seconds = conn.execute(
        query("seconds_until_next_due"),
        {"now": now, "poison_threshold": policy.poison_threshold, "skip": list(exclude)},
    ).scalar()
    return None if seconds is None else float(seconds)


def wake_delay(until_due: float | None, wake: WakePolicy = DEFAULT_WAKE) -> float:
    """How long to sleep before the next pass: until the next row is due, within
    [floor, tick]; a whole tick when nothing is queued."""
    if until_due is None:
        return wake.tick_seconds
    return min(wake.tick_seconds, max(wake.floor_seconds, until_due))


@dataclass
class LoopResult:
    outcomes: list[ProjectOutcome] = field(default_factory=list)
    passes: int = 0
    # Why the loop ended: "stopped" (stop event), "deadline", or "idle" (nothing left to
    # wait for before the deadline, with exit_when_idle).
    ended: Literal["stopped", "deadline", "idle"] = "stopped"

    def count(self, result: Result) -> int:
        return sum(1 for o in self.outcomes if o.result == result)


def drain_loop(
    engine: Engine,
    stop: threading.Event,
    *,
    policy: RecalcPolicy = DEFAULT_POLICY,
    wake: WakePolicy = DEFAULT_WAKE,
    deadline: float | None = None,
    exit_when_idle: bool = False,
    on_outcome: Callable[[ProjectOutcome], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    db_now: Callable[[], datetime | None] = lambda: None,
    wait: Callable[[float], bool] | None = None,
) -> LoopResult:
    """Drain passes until `stop` is set or `clock()` reaches `deadline`, sleeping between
    passes until the next row falls due (see `wake_delay`).

    A project whose recalc failed is not claimed again for one tick (its due_at stays in
    the past, so it would otherwise be retried in a tight loop). With `exit_when_idle` the
    loop also ends when nothing claimable is queued, or the next row falls due only after
    the deadline (a Dagster drain run: the sensor launches another when work turns up).

    `clock` (seconds, monotonic) drives the deadline and the back-off; `db_now` overrides
    the database's now() in queries (tests); `wait(seconds)` sleeps and returns True when
    stopped — by default `stop.wait`, so a stop request ends the sleep at once.
    """
    policy.validate()
    wake.validate()
    sleep = wait if wait is not None else stop.wait
    result = LoopResult()
    retry_at: dict[uuid.UUID, float] = {}

    def should_stop() -> bool:
        return stop.is_set() or (deadline is not None and clock() >= deadline)

    def collect(outcome: ProjectOutcome) -> None:
        result.outcomes.append(outcome)
        if outcome.result == "failed" and not outcome.poisoned:
            retry_at[outcome.project_id] = clock() + wake.tick_seconds
        if on_outcome is not None:
            on_outcome(outcome)

    while True:
        if should_stop():
            break
        t = clock()
        for project_id in [p for p, at in retry_at.items() if at <= t]:
            del retry_at[project_id]
        tick = drain_tick(
            engine,
            now=db_now(),
            policy=policy,
            should_stop=should_stop,
            on_outcome=collect,
            exclude=retry_at.keys(),
        )
        result.passes += 1
        if tick.stopped:
            break
        if len(tick.outcomes) >= policy.batch_size:
            continue  # a full batch: more may be due right now
        with engine.connect() as conn:
            until_due = seconds_until_next_due(
                conn, now=db_now(), policy=policy, exclude=retry_at.keys()
            )
        now = clock()
        if retry_at:
            until_retry = min(retry_at.values()) - now
            until_due = until_retry if until_due is None else min(until_due, until_retry)
        remaining = None if deadline is None else deadline - now
        if exit_when_idle and (
            until_due is None or (remaining is not None and until_due > remaining)
        ):
            result.ended = "idle"
            return result
        delay = wake_delay(until_due, wake)
        if remaining is not None:
            delay = min(delay, max(remaining, 0.0))
        if sleep(delay):
            break
    result.ended = "stopped" if stop.is_set() else "deadline"
    return result


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
