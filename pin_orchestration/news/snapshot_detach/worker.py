"""The worker: `drain` claims due rows, calls selections on a bounded pool and records
the outcomes; `run_detach_retry` is one run of it under the distributed lock."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from pin_orchestration.coordination.jobruns import RunStatus, record_job_run
from pin_orchestration.coordination.locks import renewed_lock
from pin_orchestration.news.selections import CallKind, CallResult, DetachCaller
from pin_orchestration.news.snapshot_detach.outbox import (
    autocommit,
    claim_batch,
    record_outcomes,
    release_claims,
)
from pin_orchestration.news.snapshot_detach.policy import (
    DETACH_JOB,
    LAST_ERROR_MAX,
    ClaimedEntry,
    DetachOptions,
    Outcome,
    RandomSource,
    Status,
    decide,
)
from pin_orchestration.platform import tracing

# Outcomes of calls that finish close together are written in one transaction: at most
# this long after the first of them (or once max_concurrency of them are waiting).
OUTCOME_WRITE_INTERVAL_SECONDS = 0.05
# Rounds of calls (max_concurrency rows each) claimed ahead into the pool's queue, behind
# the calls in flight: the calls go on while the drain thread claims and writes outcomes,
# however long a claim or a write takes (the drain thread also waits for the GIL after
# each round trip while 16 call threads use it). A row claimed behind QUEUED_ROUNDS
# rounds starts within QUEUED_ROUNDS call timeouts, so its lease is QUEUED_ROUNDS + 1 of
# them + the backoff.
QUEUED_ROUNDS = 2

log = logging.getLogger(__name__)

# A call's answer and when it ended on time.monotonic() (a failure's backoff counts from
# there; the database adds what is left of it to its own now()).
_Attempt = tuple[CallResult, float]


@dataclass(frozen=True)
class SnapshotDetachQuarantinedEvent:
    """Domain alert: an entry reached max_attempts and left the retry loop."""

    snapshot_id: uuid.UUID
    post_id: uuid.UUID
    reason: str
    attempts: int
    last_error: str | None

    def describe(self) -> str:
        return (
            f"SnapshotDetachQuarantinedEvent snapshotId={self.snapshot_id} postId={self.post_id} "
            f"reason={self.reason} attempts={self.attempts} lastError={self.last_error}"
        )


@dataclass
class DrainResult:
    status: RunStatus = RunStatus.SUCCEEDED
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0  # calls that did not detach (retried + quarantined)
    quarantined: int = 0
    superseded: int = 0  # outcomes not applied: a newer claim owned the row
    released: int = 0  # claimed, never called (stop requested), attempt given back
    batches: int = 0
    backlog_remaining: bool = False
    duration_ms: int = 0
    error: str | None = None
    quarantine_events: list[SnapshotDetachQuarantinedEvent] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["quarantine_events"] = [
            {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in asdict(e).items()}
            for e in self.quarantine_events
        ]
        return data


def _never() -> bool:
    return False


def drain(
    engine: Engine,
    caller: DetachCaller,
    options: DetachOptions,
    *,
    rand: RandomSource = random.random,
    should_stop: Callable[[], bool] = _never,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> DrainResult:
    """Claim, call and record until no row is due, the run's time is up, or a stop is asked.

    Run-level lines go to `logger` (the Dagster run log); per-entry lines (detached,
    retry, quarantined) to this module's logger, which a run shows as captured stderr —
    a large backlog must not turn into one event-log write per row.

    At most `max_concurrency` calls are in flight, and at most QUEUED_ROUNDS times as many
    claimed rows wait in the pool's queue, so the calls go on while the next claim or the
    outcomes are written. A queued row's call starts within QUEUED_ROUNDS call timeouts
    of its claim (the threads take the queue in order, each call ahead of it taking at
    most one timeout), so its lease — QUEUED_ROUNDS + 1 call timeouts + the backoff —
    covers its whole call; a failure's next attempt counts from the end of the call.
    No transaction is open while a call is in flight: each claim and each group of
    outcomes (written every OUTCOME_WRITE_INTERVAL_SECONDS at most) is its own short
    transaction, made on this thread's autocommit connection (a claim is two statements,
    a group of outcomes one). Due times are the database's (see queries.sql):
    the worker's wall clock is never read.
    """
    options.validate()
    result = DrainResult()
    started = time.monotonic()
    run_trace = tracing.current_context()
    # One connection for the run, used on this thread only: a pooled connection per
    # transaction cost a checkout ping and a SET on top of BEGIN, the statements, COMMIT.
    # In autocommit, each statement its own transaction: no BEGIN / COMMIT round trips.
    # This thread is the calls' only feeder, and after each round trip it waits for the
    # GIL behind the call threads, so every round trip it saves keeps the pool busier.
    with (
        autocommit(engine.connect()) as db,
        ThreadPoolExecutor(options.max_concurrency, thread_name_prefix="snapshot-detach") as pool,
    ):
        deadline = started + options.max_run_duration_seconds
        run = _Drain(
            db, pool, caller, options, rand, should_stop, logger, result, run_trace, deadline
        )
        try:
            run.until_done()
        except BaseException as exc:
            run.stop_on(exc)
            raise
        finally:
            result.duration_ms = int((time.monotonic() - started) * 1000)
    return result


@dataclass
class _Drain:
    """One drain's state and steps (see `drain`): the calls in flight, the done calls whose
    outcome is not written yet (written in groups, one transaction each), whether a claim
    may still find due rows."""

    db: Connection
    pool: ThreadPoolExecutor
    caller: DetachCaller
    options: DetachOptions
    rand: RandomSource
    should_stop: Callable[[], bool]
    logger: logging.Logger | logging.LoggerAdapter[Any]
    result: DrainResult
    run_trace: Any
    deadline: float
    inflight: dict[Future[_Attempt | None], ClaimedEntry] = field(default_factory=dict)
    finished: dict[Future[_Attempt | None], ClaimedEntry] = field(default_factory=dict)
    more_due: bool = True
    last_write: float = field(default_factory=time.monotonic)

    def until_done(self) -> None:
        """Claim, call and record until nothing is in flight or waiting and no more is
        due (or a stop is asked)."""
        while True:
            if self.should_stop():
                _release_unstarted(self.db, self.inflight, self.result)
            elif (
                self.more_due and len(self.inflight) <= QUEUED_ROUNDS * self.options.max_concurrency
            ):
                self.claim_more()
            if self.inflight:
                self.collect(OUTCOME_WRITE_INTERVAL_SECONDS)
            if self.finished and (
                not self.inflight
                or len(self.finished) >= self.options.max_concurrency
                or time.monotonic() - self.last_write >= OUTCOME_WRITE_INTERVAL_SECONDS
            ):
                self.settle()
            if (
                not self.inflight
                and not self.finished
                and (not self.more_due or self.should_stop())
            ):
                break
        if self.should_stop():
            self.result.status = RunStatus.CANCELLED

    def claim_more(self) -> None:
        options, result = self.options, self.result
        if time.monotonic() >= self.deadline:
            self.more_due = False
            result.backlog_remaining = True
            self.logger.warning(
                "%s reached max_run_duration_seconds=%s; the next tick takes the rest",
                DETACH_JOB.code,
                options.max_run_duration_seconds,
            )
            return
        # Claimed only once a round of calls' worth of room is free (claims of
        # ~max_concurrency rows, not one per finished call). The lease covers the wait in
        # the queue (one call timeout) and the call itself: nobody can claim the row
        # meanwhile.
        claimed = claim_batch(
            self.db,
            options,
            self.rand,
            limit=(QUEUED_ROUNDS + 1) * options.max_concurrency - len(self.inflight),
            call_timeout_seconds=(QUEUED_ROUNDS + 1) * self.caller.timeout_seconds,
        )
        # Claim again until a claim comes back empty: under SKIP LOCKED a short batch may
        # only mean a parallel runner held some rows.
        self.more_due = bool(claimed)
        if claimed:
            result.batches += 1
            result.claimed += len(claimed)
            log.info("%s batch claimed: rows=%d", DETACH_JOB.code, len(claimed))
        for entry in claimed:
            self.inflight[self.pool.submit(self.attempt, entry)] = entry

    def attempt(self, entry: ClaimedEntry) -> _Attempt | None:
        """One call, on a pool thread."""
        # Stop is honoured between records: a queued call not yet started is not made.
        if self.should_stop():
            return None
        attributes = {"snapshotId": str(entry.snapshot_id), "attempts": entry.attempts}
        with tracing.span(
            f"{DETACH_JOB.code}.attempt", attributes, parent=self.run_trace
        ) as current:
            call = self.caller.detach(entry.snapshot_id, entry.reason)
            current.set_attribute("outcome", call.code)
        return call, time.monotonic()

    def collect(self, timeout: float | None) -> None:
        done, _ = wait(list(self.inflight), timeout=timeout, return_when=FIRST_COMPLETED)
        for future in done:
            self.finished[future] = self.inflight.pop(future)

    def settle(self) -> None:
        """Write the finished calls' outcomes and give back the claims never called."""
        outcomes, unstarted = [], []
        for future, entry in self.finished.items():
            try:
                done = future.result()
            except Exception as exc:  # noqa: BLE001 — a bug in one call must not stop the run
                failed = CallResult(CallKind.TRANSIENT, f"error:{type(exc).__name__}")
                done = failed, self.last_write
            if done is None:
                unstarted.append(entry)
            else:
                call, ended_at = done
                since = time.monotonic() - ended_at
                outcomes.append(
                    decide(entry, call, self.options, self.rand, since_call_ended_seconds=since)
                )
        self.finished.clear()
        self.last_write = time.monotonic()
        _apply_outcomes(self.db, outcomes, self.result)
        _release(self.db, unstarted, self.result)

    def stop_on(self, exc: BaseException) -> None:
        """Interrupted (run terminated, Ctrl-C) or the database failed: stop gracefully —
        unstarted claims are given back, calls in flight finish and are recorded."""
        result = self.result
        result.status = RunStatus.CANCELLED if _is_interrupt(exc) else RunStatus.FAILED
        result.error = f"{type(exc).__name__}: {exc}"[:LAST_ERROR_MAX]
        result.backlog_remaining = True
        try:
            _release_unstarted(self.db, self.inflight, result)
            while self.inflight:
                self.collect(None)
            self.settle()
        except Exception:  # noqa: BLE001 — the original error is the one to report
            self.logger.exception("%s could not record outcomes while stopping", DETACH_JOB.code)


def _is_interrupt(exc: BaseException) -> bool:
    return not isinstance(exc, Exception)


def _release_unstarted(
    db: Connection,
    inflight: dict[Future[_Attempt | None], ClaimedEntry],
    result: DrainResult,
) -> None:
    unstarted = [future for future in inflight if future.cancel()]
    _release(db, [inflight.pop(future) for future in unstarted], result)


def _release(db: Connection, entries: Sequence[ClaimedEntry], result: DrainResult) -> None:
    if not entries:
        return
    released = release_claims(db, entries)
    result.released += released
    result.backlog_remaining = True
    log.warning(
        "%s stop requested: %d claimed rows not called, %d given back their attempt",
        DETACH_JOB.code,
        len(entries),
        released,
    )


def _apply_outcomes(
    db: Connection,
    outcomes: Sequence[Outcome],
    result: DrainResult,
) -> None:
    try:
        retry_at = record_outcomes(db, outcomes)
    except Exception:  # noqa: BLE001 — rows stay Pending with their backoff; the run goes on
        log.exception(
            "%s could not record %d outcomes; the rows stay Pending and are retried after "
            "their backoff",
            DETACH_JOB.code,
            len(outcomes),
        )
        return
    for outcome in outcomes:
        entry = outcome.entry
        if entry.id not in retry_at:
            result.superseded += 1
            log.warning(
                "entry outcome superseded: snapshotId=%s attempts=%d (a newer claim owns the row)",
                entry.snapshot_id,
                entry.attempts,
            )
        elif outcome.status == Status.DONE:
            result.succeeded += 1
            log.info(
                "entry detached: snapshotId=%s attempts=%d code=%s",
                entry.snapshot_id,
                entry.attempts,
                outcome.call.code,
            )
        elif outcome.status == Status.PENDING:
            result.failed += 1
            result.retried += 1
            log.info(
                "entry retry: snapshotId=%s attempts=%d errorCode=%s nextAttemptAt=%s",
                entry.snapshot_id,
                entry.attempts,
                outcome.last_error,
                retry_at[entry.id].isoformat(),
            )
        else:
            result.failed += 1
            result.quarantined += 1
            event = SnapshotDetachQuarantinedEvent(
                snapshot_id=entry.snapshot_id,
                post_id=entry.post_id,
                reason=entry.reason,
                attempts=entry.attempts,
                last_error=outcome.last_error,
            )
            result.quarantine_events.append(event)
            log.error("entry quarantined: %s", event.describe())


# --- one run under the lock ------------------------------------------------------------------


@tracing.traced(
    DETACH_JOB.code,
    lambda a: {"jobRunId": a["run_id"]},
    lambda result: {
        "status": result.status.value,
        "succeeded": result.succeeded,
        "retried": result.retried,
        "quarantined": result.quarantined,
    },
)
def run_detach_retry(
    engine: Engine,
    caller: DetachCaller,
    options: DetachOptions,
    *,
    run_id: str,
    holder: str,
    rand: RandomSource = random.random,
    stop_requested: threading.Event | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> DrainResult:
    """One run of the job under `DETACH_JOB.lock_key`, renewed while it works; a held lock skips the
    run without waiting, and a lost one stops it (FAILED) before its next claim.

    The run is recorded in pin.job_runs (its counts feed the metrics and the
    "no successful run" alert).
    """
    options.validate()
    with engine.connect() as conn:
        started_at = conn.execute(text("SELECT now()")).scalar_one()
    with renewed_lock(engine, DETACH_JOB.lock_key, options.lock_ttl_seconds, holder) as lease:
        if not lease.acquired:
            logger.info(
                "%s skipped, lock held (key=%s, run=%s)",
                DETACH_JOB.code,
                DETACH_JOB.lock_key,
                run_id,
            )
            result = DrainResult(status=RunStatus.SKIPPED)
            _record(engine, result, run_id, started_at)
            return result
        logger.info("%s started: jobRunId=%s", DETACH_JOB.code, run_id)

        def should_stop() -> bool:
            # A lost lock stops the run like a stop request: no new claim or call; calls
            # in flight finish and are recorded (their outcomes carry the claim's stamp).
            return lease.lost.is_set() or (stop_requested is not None and stop_requested.is_set())

        try:
            result = drain(
                engine,
                caller,
                options,
                rand=rand,
                should_stop=should_stop,
                logger=logger,
            )
        except BaseException as exc:
            failed = DrainResult(
                status=RunStatus.CANCELLED if _is_interrupt(exc) else RunStatus.FAILED,
                error=f"{type(exc).__name__}: {exc}"[:LAST_ERROR_MAX],
            )
            _record(engine, failed, run_id, started_at)
            raise
        if lease.lost.is_set():
            result.status = RunStatus.FAILED
            result.error = f"lost the lock {DETACH_JOB.lock_key}; stopped"
            result.backlog_remaining = True
        _record(engine, result, run_id, started_at)
        logger.info(
            "%s completed: status=%s succeeded=%d retried=%d quarantined=%d durationMs=%d",
            DETACH_JOB.code,
            result.status.value,
            result.succeeded,
            result.retried,
            result.quarantined,
            result.duration_ms,
        )
        return result


def _record(engine: Engine, result: DrainResult, run_id: str, started_at: datetime) -> None:
    record_job_run(
        engine,
        job_code=DETACH_JOB.code,
        run_id=run_id,
        status=result.status.value,
        started_at=started_at,
        result=result.summary(),
    )
