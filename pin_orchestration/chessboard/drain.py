"""The drain worker's tick (seed 002, AGG-2 and AGG-6).

A tick takes up to `batch_size` due rows, oldest due first, one at a time, each in three
short steps so that a raiser never waits for a recalc nor deadlocks with one:

1. claim: a transaction of its own commits a lease on the row (claimed_until, a token);
   `FOR UPDATE SKIP LOCKED` skips a row another drain is claiming, and the lease keeps the
   other drains off it while it is recalculated. A lease left by a killed drain expires
   after `claim_lease_seconds`, and another drain takes the row.
2. recalc: the project's counters and outbox rows commit together, in a transaction that
   does not hold the queue row and never waits for a row lock: every row it updates is
   locked NOWAIT first (chessboard/queries.sql). A raiser holding one of them — whatever
   else it locked, in whichever order — makes the recalc roll back at once, a conflict,
   not a failure: the lease is given back and the project is retried
   `conflict_retry_seconds` later with no attempt counted (the next claimable row is
   taken meanwhile). So a raiser never deadlocks with a recalc and never waits for one
   beyond the few statements of a recalc that already holds every row it needs.
3. finish: the row is deleted only if it was not raised again meanwhile (requested_count,
   updated_at and due_at as the claim read them) and the lease is still ours; a request
   raised during the recalc keeps the row, unleased, for one more recalc. The finish is
   the recalc transaction's last statement when the row is free (`SKIP LOCKED`: never a
   wait while the project's locks are held); when a raiser's transaction holds the row it
   runs after the commit, in a transaction of its own that may wait for the raiser.

A failing project rolls back alone; its row stays (due_at unchanged) with attempt_count
+ 1, last_error and not_before = now + `tick_seconds`, so no drain — this one or another
— retries it before a tick has passed; at `poison_threshold` attempts it raises
CHESSBOARD_RECALC_POISON and is left for manual handling (runbook reset). A stop request
is honoured between projects: the current one commits or rolls back whole.

`drain_loop` runs passes back to back and, between them, sleeps until the next row becomes
claimable (one min(claimable_at) query) instead of a blind tick: a row due just after a
pass is taken within `floor_seconds`, not up to a whole tick later. The sleep is bounded
above by the tick (a row queued meanwhile by another process is still seen within a tick)
and below by the floor (a due row held by another worker must not make this one spin).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Engine, Row
from sqlalchemy.exc import DBAPIError

from pin_orchestration.chessboard.metrics import (
    LOCK_CONFLICTS,
    add_metrics,
    record_heartbeat,
    record_outcomes,
)
from pin_orchestration.chessboard.outcomes import ProjectOutcome, Result, TickResult
from pin_orchestration.chessboard.queue import (
    DEFAULT_POLICY,
    DRAIN_IDLE_SECONDS,
    RecalcPolicy,
    query,
    queue_stats,
)
from pin_orchestration.chessboard.recalc import RecalcResult, recalc_project
from pin_orchestration.coordination.locks import end_transaction_idle_past
from pin_orchestration.platform import tracing

POISON_ALERT = "CHESSBOARD_RECALC_POISON"
LAST_ERROR_MAX = 1024
# lock_not_available (NOWAIT), deadlock_detected, serialization_failure: another
# transaction held a row the recalc needed — retried later, never counted as an attempt.
LOCK_CONFLICT_SQLSTATES = frozenset({"55P03", "40P01", "40001"})
FORCE_RECALC_TRIES = 5

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """A queue row as its drain claimed it: what `finish_claim` compares to tell a request
    raised during the recalc from the one it served."""

    project_id: uuid.UUID
    tenant_id: uuid.UUID
    due_at: datetime
    updated_at: datetime
    requested_count: int
    last_reason: str
    attempt_count: int
    # None: a forced recalc of a row no drain had claimed.
    claim_token: uuid.UUID | None
    claimed_at: datetime


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:LAST_ERROR_MAX]


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc.orig, "sqlstate", None) if isinstance(exc, DBAPIError) else None


def is_lock_conflict(exc: BaseException) -> bool:
    """The recalc met a row another transaction holds (see LOCK_CONFLICT_SQLSTATES)."""
    return _sqlstate(exc) in LOCK_CONFLICT_SQLSTATES


# The sqlstate of a session PostgreSQL ended for idling in its transaction: this drain's own
# stall (DRAIN_IDLE_SECONDS without a statement), not a failure of the project.
IDLE_TIMEOUT_SQLSTATE = "25P03"


def claim_next_due(
    engine: Engine, *, now: datetime | None = None, policy: RecalcPolicy = DEFAULT_POLICY
) -> Claim | None:
    """Lease the oldest claimable row to this drain (committed at once); None when no row
    is claimable."""
    with engine.begin() as conn:
        end_transaction_idle_past(conn, DRAIN_IDLE_SECONDS)
        row = conn.execute(
            query("claim_next_due"),
            {
                "now": now,
                "poison_threshold": policy.poison_threshold,
                "lease_seconds": policy.claim_lease_seconds,
                "token": uuid.uuid4(),
            },
        ).first()
    return None if row is None else Claim(**row._mapping)


def _finish_params(claim: Claim) -> dict[str, object]:
    return {
        "project_id": claim.project_id,
        "token": claim.claim_token,
        "requested_count": claim.requested_count,
        "updated_at": claim.updated_at,
        "due_at": claim.due_at,
        "claimed_at": claim.claimed_at,
    }


def finish_claim(engine: Engine, claim: Claim) -> bool:
    """After the recalc committed: delete the request, unless it was raised again meanwhile
    (then release the lease: the row stays for one more recalc) or the lease passed to
    another drain (then leave the row alone). True when the request was deleted. Waits
    for a raiser holding the row; the drain holds no other lock then."""
    params = _finish_params(claim)
    with engine.begin() as conn:
        end_transaction_idle_past(conn, DRAIN_IDLE_SECONDS)
        if conn.execute(query("finish_claim"), params).first() is not None:
            return True
        if claim.claim_token is not None:
            conn.execute(query("release_claim"), params)
    return False


@tracing.traced(
    "project-aggregates-recalc.project",
    result_attributes=lambda outcome: (
        {"claimed": False}
        if outcome is None
        else {
            "ProjectId": str(outcome.project_id),
            "TenantId": str(outcome.tenant_id),
            "LastReason": outcome.last_reason,
            "result": outcome.result,
            "requeued": outcome.requeued,
        }
    ),
)
def process_next_due(
    engine: Engine,
    *,
    now: datetime | None = None,
    policy: RecalcPolicy = DEFAULT_POLICY,
) -> ProjectOutcome | None:
    """Claim, recalculate and finish one due row; None when none is claimable (or every
    due row is held by another worker, or by a raiser's transaction)."""
    while True:
        started = time.perf_counter()
        claim = claim_next_due(engine, now=now, policy=policy)
        if claim is None:
            return None
        try:
            with engine.begin() as conn:
                end_transaction_idle_past(conn, DRAIN_IDLE_SECONDS)
                recalc = recalc_project(conn, claim.project_id, claim.tenant_id)
                # Usually the row is free: finished in the recalc's own commit.
                finished = conn.execute(
                    query("finish_claim_in_recalc"), _finish_params(claim)
                ).one()
        except Exception as exc:
            # Ended for idling: this drain stalled, the project did not fail; retried
            # like a conflict, no attempt counted (the lease may have passed on already).
            if not (is_lock_conflict(exc) or _sqlstate(exc) == IDLE_TIMEOUT_SQLSTATE):
                return _record_failure(engine, claim, exc, started, policy, now)
            _defer(engine, claim, exc, policy, now)
            continue
        return _finish(engine, claim, recalc, finished, started)


def _finish(
    engine: Engine, claim: Claim, recalc: RecalcResult, finished: Row[Any], started: float
) -> ProjectOutcome:
    """After the recalc committed: the row finished (there or now) and the outcome logged."""
    if finished.deleted or finished.released:
        requeued = bool(finished.released)
    else:  # a raiser held the row at the end of the recalc (or the lease was lost)
        requeued = not finish_claim(engine, claim)

    outcome = ProjectOutcome(
        project_id=claim.project_id,
        tenant_id=claim.tenant_id,
        result="skipped" if recalc.skipped else "recalculated",
        duration_seconds=time.perf_counter() - started,
        requested_count=claim.requested_count,
        last_reason=claim.last_reason,
        recalc=recalc,
        attempt_count=claim.attempt_count,
        requeued=requeued,
    )
    if recalc.skipped:
        log.info(
            "project_skipped_archived project_id=%s reason=%s",
            claim.project_id,
            recalc.skip_reason,
        )
    else:
        log.info(
            "project_recalculated project_id=%s tenant_id=%s duration_ms=%.1f "
            "republished=%s requeued=%s",
            claim.project_id,
            claim.tenant_id,
            outcome.duration_seconds * 1000,
            recalc.republished,
            requeued,
        )
    return outcome


def _defer(
    engine: Engine, claim: Claim, exc: Exception, policy: RecalcPolicy, now: datetime | None
) -> None:
    """After the rollback on a held row: the lease back, the project retried
    `conflict_retry_seconds` later, attempt_count untouched; counted in
    lock_conflicts_total. May wait for a raiser holding the queue row: the drain holds no
    other lock now."""
    with engine.begin() as conn:
        end_transaction_idle_past(conn, DRAIN_IDLE_SECONDS)
        conn.execute(
            query("defer_claim"),
            {
                "project_id": claim.project_id,
                "token": claim.claim_token,
                "now": now,
                "retry_after_seconds": policy.conflict_retry_seconds,
            },
        )
        add_metrics(conn, {(LOCK_CONFLICTS, ""): 1.0})
    log.info(
        "project_recalc_deferred project_id=%s retry_after_seconds=%s reason=%s",
        claim.project_id,
        policy.conflict_retry_seconds,
        _error_text(exc).splitlines()[0],
    )


def _record_failure(
    engine: Engine,
    claim: Claim,
    exc: Exception,
    started: float,
    policy: RecalcPolicy,
    now: datetime | None,
) -> ProjectOutcome:
    """After the rollback: attempt_count + 1, last_error and a not-before one tick away,
    in a transaction of its own."""
    error = _error_text(exc)
    with engine.begin() as conn:
        end_transaction_idle_past(conn, DRAIN_IDLE_SECONDS)
        attempts = conn.execute(
            query("record_failure"),
            {
                "project_id": claim.project_id,
                "token": claim.claim_token,
                "error": error,
                "now": now,
                "retry_after_seconds": policy.tick_seconds,
            },
        ).scalar()
    # None: the lease passed to another drain meanwhile, which records its own attempt (and
    # its own poison): this failure counts none, and raises no alert.
    lease_lost = attempts is None
    attempts = claim.attempt_count if attempts is None else attempts
    poisoned = not lease_lost and attempts >= policy.poison_threshold
    log.error(
        "project_recalc_failed project_id=%s attempt_count=%s error=%s",
        claim.project_id,
        attempts,
        error,
    )
    if poisoned:
        log.error(
            "%s project_id=%s attempt_count=%s: left in the queue for manual handling "
            "(runbook: fix, then `pin chessboard reset-poison %s`); last_error=%s",
            POISON_ALERT,
            claim.project_id,
            attempts,
            claim.project_id,
            error,
        )
    return ProjectOutcome(
        project_id=claim.project_id,
        tenant_id=claim.tenant_id,
        result="failed",
        duration_seconds=time.perf_counter() - started,
        requested_count=claim.requested_count,
        last_reason=claim.last_reason,
        error=error,
        attempt_count=attempts,
        poisoned=poisoned,
    )


@tracing.traced(
    "project-aggregates-recalc.tick",
    lambda a: {"correlationId": str(uuid.uuid4())},
    lambda tick: {"projects": len(tick.outcomes), "stopped": tick.stopped},
)
def drain_tick(
    engine: Engine,
    *,
    now: datetime | None = None,
    policy: RecalcPolicy = DEFAULT_POLICY,
    should_stop: Callable[[], bool] = lambda: False,
    on_outcome: Callable[[ProjectOutcome], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TickResult:
    """One worker tick: up to `policy.batch_size` due projects, each claimed on its own.
    The tick is recorded in the metrics even when empty (liveness of an idle worker); a
    tick with work also beats when it starts and, while it works, once every
    `policy.tick_seconds` by `clock` (between projects, so never a write per project)."""
    policy.validate()
    tick = TickResult()
    with engine.connect() as conn:
        due = queue_stats(conn, now=now, policy=policy).due
    if due:
        log.info("recalc_batch_started size=%d", min(due, policy.batch_size))
        record_heartbeat(engine)
        beat_at = clock()
    while due and len(tick.outcomes) < policy.batch_size:
        if should_stop():
            tick.stopped = True
            log.info("recalc_batch_cancelled after %d projects", len(tick.outcomes))
            break
        if clock() - beat_at >= policy.tick_seconds:
            record_heartbeat(engine)
            beat_at = clock()
        outcome = process_next_due(engine, now=now, policy=policy)
        if outcome is None:
            break
        tick.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    record_outcomes(engine, tick.outcomes)
    return tick


def seconds_until_next_due(
    conn: Connection, *, now: datetime | None = None, policy: RecalcPolicy = DEFAULT_POLICY
) -> float | None:
    """Seconds until the next row becomes claimable (<= 0: already); None when none is
    queued. Poison rows are left out, as the claim leaves them out."""
    seconds = conn.execute(
        query("seconds_until_next_due"), {"now": now, "poison_threshold": policy.poison_threshold}
    ).scalar()
    return None if seconds is None else float(seconds)


def wake_delay(until_due: float | None, policy: RecalcPolicy = DEFAULT_POLICY) -> float:
    """How long to sleep before the next pass: until the next row is claimable, within
    [floor, tick]; a whole tick when nothing is queued."""
    if until_due is None:
        return policy.tick_seconds
    return min(policy.tick_seconds, max(policy.floor_seconds, until_due))


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
    deadline: float | None = None,
    exit_when_idle: bool = False,
    on_outcome: Callable[[ProjectOutcome], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    db_now: Callable[[], datetime | None] = lambda: None,
    wait: Callable[[float], bool] | None = None,
) -> LoopResult:
    """Drain passes until `stop` is set or `clock()` reaches `deadline`, sleeping between
    passes until the next row becomes claimable (see `wake_delay`).

    With `exit_when_idle` the loop also ends when nothing claimable is queued, or the next
    row becomes claimable only after the deadline (a Dagster drain run: the sensor
    launches another when work turns up).

    `clock` (seconds, monotonic) drives the deadline; `db_now` overrides the database's
    now() in queries (tests); `wait(seconds)` sleeps and returns True when stopped — by
    default `stop.wait`, so a stop request ends the sleep at once.
    """
    policy.validate()
    sleep = wait if wait is not None else stop.wait
    result = LoopResult()

    def should_stop() -> bool:
        return stop.is_set() or (deadline is not None and clock() >= deadline)

    def collect(outcome: ProjectOutcome) -> None:
        result.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    while True:
        if should_stop():
            break
        tick = drain_tick(
            engine, now=db_now(), policy=policy, should_stop=should_stop, on_outcome=collect
        )
        result.passes += 1
        if tick.stopped:
            break
        if len(tick.outcomes) >= policy.batch_size:
            continue  # a full batch: more may be due right now
        with engine.connect() as conn:
            until_due = seconds_until_next_due(conn, now=db_now(), policy=policy)
        remaining = None if deadline is None else deadline - clock()
        if exit_when_idle and (
            until_due is None or (remaining is not None and until_due > remaining)
        ):
            result.ended = "idle"
            return result
        delay = wake_delay(until_due, policy)
        if remaining is not None:
            delay = min(delay, max(remaining, 0.0))
        if sleep(delay):
            break
    result.ended = "stopped" if stop.is_set() else "deadline"
    return result


def force_recalc_project(engine: Engine, project_id: uuid.UUID) -> RecalcResult:
    """Recalculate one project now, whatever the queue says (Dagster backfill of a
    partition). A pending queue row no drain has claimed is covered and deleted, unless
    it is raised again during the recalc; a claimed one is left to its drain. A row held
    by another transaction (a raiser, a drain) is retried a few times, briefly apart,
    before the lock conflict is raised."""
    with engine.connect() as conn:
        request = conn.execute(query("read_request"), {"project_id": project_id}).first()
    for attempt in range(FORCE_RECALC_TRIES):
        try:
            with engine.begin() as conn:
                recalc = recalc_project(conn, project_id, request.tenant_id if request else None)
            break
        except DBAPIError as exc:
            if not is_lock_conflict(exc) or attempt == FORCE_RECALC_TRIES - 1:
                raise
            time.sleep(0.1 * 2**attempt)
    if request is not None and request.claim_token is None:
        finish_claim(engine, Claim(**request._mapping))
    log.info(
        "project_force_recalculated project_id=%s republished=%s", project_id, recalc.republished
    )
    return recalc
