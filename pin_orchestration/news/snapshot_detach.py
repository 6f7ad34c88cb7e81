"""news-snapshot-detach-retry (seed 001): the outbox safety net that makes orphaned
selection snapshots end up Detached even when the selections service is down.

Read top to bottom: options and their validation, the backoff formula, the enqueue helper
for the owning operations, the claim / outcome / release transactions, then
`drain` (the worker loop) and `run_detach_retry` (one run under the distributed lock).

A row is worked in two short transactions per attempt, with the HTTP call between them
and no transaction or row lock open across it:

    claim   — lock due Pending rows (SKIP LOCKED), attempts += 1,
              next_attempt_at = now + backoff(attempts); commit.
    call    — POST {selections}/internal/snapshots/{id}/detach {reason}.
    outcome — 2xx → Done; failure → stays Pending (backoff already set) with last_error,
              or Quarantined once attempts >= max_attempts; applied only while the row
              still carries this claim's stamp (optimistic concurrency).

A crash between claim and outcome therefore leaves the row Pending with its backoff: the
next run after the backoff retries it (pre-increment is the safe direction).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, text

from pin_orchestration.jobruns import RunStatus, last_successful_run_at, record_job_run
from pin_orchestration.locks import extend_lock, held_lock
from pin_orchestration.news.selections import CallKind, CallResult, DetachCaller
from pin_orchestration.sql import load_queries

JOB_CODE = "news-snapshot-detach-retry"
LOCK_KEY = "Pin:lock:job:scheduled:news-snapshot-detach-retry"
LAST_ERROR_MAX = 512
# Outcomes of calls that finish close together are written in one transaction: at most
# this long after the first of them (or once max_concurrency of them are waiting).
OUTCOME_WRITE_INTERVAL_SECONDS = 0.05

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
RandomSource = Callable[[], float]


class Reason(StrEnum):
    BLOCK_REPLACED = "BlockReplaced"
    POST_DELETED = "PostDeleted"


class Status(StrEnum):
    PENDING = "Pending"
    DONE = "Done"
    QUARANTINED = "Quarantined"


class SnapshotDetachConfigError(ValueError):
    """The run's options are invalid; raised before any work is done."""


@dataclass(frozen=True)
class DetachOptions:
    """SnapshotDetachRetryOptions of the seed (TimeSpans in seconds), plus the concurrency.

    DetachCallTimeout belongs to the selections client (`SelectionsResource`), and
    PollingInterval to the sensor; both validate their own values.
    """

    batch_size: int = 100
    max_run_duration_seconds: float = 4 * 60
    max_attempts: int = 12
    backoff_base_seconds: float = 60
    backoff_factor: float = 2.0
    backoff_cap_seconds: float = 30 * 60
    # Jitter is uniform in [0, ratio × delay): spreads the retries of a burst of failures.
    backoff_jitter_ratio: float = 0.1
    lock_ttl_seconds: float = 6 * 60
    # Selections calls in flight at once (bounded; also the HTTP connection pool size).
    max_concurrency: int = 8

    def validate(self) -> None:
        rules: list[tuple[str, bool, str]] = [
            ("batch_size", self.batch_size > 0, "must be > 0"),
            ("max_run_duration_seconds", self.max_run_duration_seconds > 0, "must be > 0"),
            ("max_attempts", self.max_attempts > 0, "must be > 0"),
            ("backoff_base_seconds", self.backoff_base_seconds > 0, "must be > 0"),
            ("backoff_factor", self.backoff_factor >= 1, "must be >= 1"),
            (
                "backoff_cap_seconds",
                self.backoff_cap_seconds >= self.backoff_base_seconds,
                "must be >= backoff_base_seconds",
            ),
            ("backoff_jitter_ratio", 0 <= self.backoff_jitter_ratio <= 1, "must be in [0, 1]"),
            (
                "lock_ttl_seconds",
                self.lock_ttl_seconds > self.max_run_duration_seconds,
                "must exceed max_run_duration_seconds so the lock cannot expire under a live run",
            ),
            ("max_concurrency", self.max_concurrency > 0, "must be > 0"),
        ]
        defaults = {f.name: f.default for f in fields(DetachOptions)}
        problems = [
            f"{name} {rule} (got {getattr(self, name)!r}; default is {defaults[name]!r})"
            for name, ok, rule in rules
            if not ok
        ]
        if problems:
            raise SnapshotDetachConfigError(
                "invalid news-snapshot-detach-retry config: " + "; ".join(problems)
            )


def backoff_seconds(
    attempts: int,
    *,
    base: float,
    factor: float,
    cap: float,
    jitter_ratio: float,
    rand: RandomSource = random.random,
) -> float:
    """min(base · factor^(attempts−1), cap) + jitter, jitter uniform in [0, ratio × delay)."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1 (got {attempts})")
    # factor^(n-1) overflows a float for a large n long after it passed the cap.
    exponent = attempts - 1
    delay = cap if exponent > 1000 else min(base * factor**exponent, cap)
    return delay + jitter_ratio * delay * rand()


def next_attempt_at(
    now: datetime, attempts: int, options: DetachOptions, rand: RandomSource = random.random
) -> datetime:
    delay = backoff_seconds(
        attempts,
        base=options.backoff_base_seconds,
        factor=options.backoff_factor,
        cap=options.backoff_cap_seconds,
        jitter_ratio=options.backoff_jitter_ratio,
        rand=rand,
    )
    return now + timedelta(seconds=delay)


def _query(name: str) -> Any:
    return text(load_queries("pin_orchestration.news", "snapshot_detach.sql")[name])


# --- enqueue (the owning operations: set-blocks / delete-post) ------------------------------


def enqueue_snapshot_detach(
    conn: Connection, snapshot_id: uuid.UUID, post_id: uuid.UUID, reason: Reason | str
) -> uuid.UUID:
    """Write the detach intent in the caller's transaction; return the active row's id.

    A snapshot that already has an active (not Done) row gets no second one: the existing
    row's id is returned (ux_sdo_snapshot dedupe). The SQL function
    news.enqueue_snapshot_detach does the work, the same one other services call.
    """
    params = {"snapshot_id": snapshot_id, "post_id": post_id, "reason": Reason(reason).value}
    return conn.execute(_query("enqueue"), params).scalar_one()


# --- claim / outcome / release ---------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedEntry:
    id: uuid.UUID
    snapshot_id: uuid.UUID
    post_id: uuid.UUID
    reason: str
    # The claim stamp: what the row carries after this claim, its optimistic version.
    attempts: int
    next_attempt_at: datetime
    # What it carried before, to give the attempt back if the call never started.
    previous_attempts: int
    previous_next_attempt_at: datetime


@dataclass(frozen=True)
class Outcome:
    entry: ClaimedEntry
    status: Status
    call: CallResult

    @property
    def last_error(self) -> str | None:
        if self.status == Status.DONE:
            return None
        return f"{self.call.kind.value}:{self.call.code}"[:LAST_ERROR_MAX]


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


def _stamp_params(entries: Sequence[ClaimedEntry]) -> dict[str, list[Any]]:
    return {
        "ids": [e.id for e in entries],
        "attempts": [e.attempts for e in entries],
        "next_attempt_ats": [e.next_attempt_at for e in entries],
    }


def _relaxed_commit(conn: Connection) -> None:
    """Don't wait for the WAL flush: a claim or an outcome lost to a database crash only
    means one more (idempotent, INV-SNP-005) detach call after the backoff."""
    conn.execute(text("SET LOCAL synchronous_commit = off"))


def claim_due(
    conn: Connection,
    options: DetachOptions,
    now: datetime,
    rand: RandomSource = random.random,
) -> list[ClaimedEntry]:
    """Lock up to batch_size due rows (SKIP LOCKED) and stamp the attempt; caller commits."""
    rows = conn.execute(_query("lock_due"), {"now": now, "batch_size": options.batch_size}).all()
    claimed = [
        ClaimedEntry(
            id=row.id,
            snapshot_id=row.snapshot_id,
            post_id=row.post_id,
            reason=row.reason,
            attempts=row.attempts + 1,
            next_attempt_at=next_attempt_at(now, row.attempts + 1, options, rand),
            previous_attempts=row.attempts,
            previous_next_attempt_at=row.next_attempt_at,
        )
        for row in rows
    ]
    if claimed:
        conn.execute(_query("mark_claimed"), {**_stamp_params(claimed), "now": now})
    return claimed


def claim_batch(
    engine: Engine, options: DetachOptions, now: datetime, rand: RandomSource = random.random
) -> list[ClaimedEntry]:
    """The claim as its own transaction: committed (row locks released) on return."""
    with engine.begin() as conn:
        _relaxed_commit(conn)
        return claim_due(conn, options, now, rand)


def decide(entry: ClaimedEntry, call: CallResult, options: DetachOptions) -> Outcome:
    if call.kind == CallKind.DETACHED:
        return Outcome(entry, Status.DONE, call)
    if entry.attempts >= options.max_attempts:
        return Outcome(entry, Status.QUARANTINED, call)
    return Outcome(entry, Status.PENDING, call)


def record_outcomes(engine: Engine, outcomes: Sequence[Outcome], now: datetime) -> set[uuid.UUID]:
    """Write outcomes in one short transaction; return the ids actually updated.

    An outcome whose row no longer carries its claim's stamp (a newer claim took the row,
    or an operator changed it) is not applied.
    """
    if not outcomes:
        return set()
    params = {
        **_stamp_params([o.entry for o in outcomes]),
        "statuses": [o.status.value for o in outcomes],
        "last_errors": [o.last_error for o in outcomes],
        "now": now,
    }
    with engine.begin() as conn:
        _relaxed_commit(conn)
        return set(conn.execute(_query("record_outcomes"), params).scalars())


def release_claims(engine: Engine, entries: Sequence[ClaimedEntry], now: datetime) -> int:
    """Give back claims whose call never started (stop requested); returns rows released."""
    if not entries:
        return 0
    params = {
        **_stamp_params(entries),
        "previous_attempts": [e.previous_attempts for e in entries],
        "previous_next_attempt_ats": [e.previous_next_attempt_at for e in entries],
        "now": now,
    }
    with engine.begin() as conn:
        return conn.execute(_query("release_claims"), params).rowcount


# --- the worker loop -------------------------------------------------------------------------


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


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _never() -> bool:
    return False


def drain(
    engine: Engine,
    caller: DetachCaller,
    options: DetachOptions,
    *,
    clock: Clock = _utc_now,
    rand: RandomSource = random.random,
    should_stop: Callable[[], bool] = _never,
    on_batch: Callable[[], None] | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> DrainResult:
    """Claim, call and record until no row is due, the run's time is up, or a stop is asked.

    Run-level lines go to `logger` (the Dagster run log); per-entry lines (detached,
    retry, quarantined) to this module's logger, which a run shows as captured stderr —
    a large backlog must not turn into one event-log write per row.

    At most `max_concurrency` calls are in flight; the next batch is claimed as soon as
    no more than that are left queued or running, so the pool never idles while rows are
    due. No transaction is open while a call is in flight: each claim and each group of
    outcomes (written every OUTCOME_WRITE_INTERVAL_SECONDS at most) is its own short
    transaction, made on this thread.
    """
    options.validate()
    result = DrainResult()
    started = time.monotonic()
    deadline = started + options.max_run_duration_seconds
    inflight: dict[Future[CallResult | None], ClaimedEntry] = {}
    more_due = True

    def attempt(entry: ClaimedEntry) -> CallResult | None:
        # Stop is honoured between records: a queued call not yet started is not made.
        if should_stop():
            return None
        return caller.detach(entry.snapshot_id, entry.reason)

    # Done calls whose outcome is not written yet: written in groups, one transaction each.
    finished: dict[Future[CallResult | None], ClaimedEntry] = {}
    last_write = time.monotonic()

    def settle() -> None:
        nonlocal last_write
        outcomes, unstarted = [], []
        for future, entry in finished.items():
            try:
                call = future.result()
            except Exception as exc:  # noqa: BLE001 — a bug in one call must not stop the run
                call = CallResult(CallKind.TRANSIENT, f"error:{type(exc).__name__}")
            if call is None:
                unstarted.append(entry)
            else:
                outcomes.append(decide(entry, call, options))
        finished.clear()
        last_write = time.monotonic()
        _apply_outcomes(engine, outcomes, clock(), result)
        _release(engine, unstarted, clock(), result)

    def collect(timeout: float | None) -> None:
        done, _ = wait(list(inflight), timeout=timeout, return_when=FIRST_COMPLETED)
        for future in done:
            finished[future] = inflight.pop(future)

    with ThreadPoolExecutor(options.max_concurrency, thread_name_prefix="snapshot-detach") as pool:
        try:
            while True:
                if should_stop():
                    _release_unstarted(engine, inflight, clock(), result)
                elif more_due and len(inflight) <= options.max_concurrency:
                    if time.monotonic() >= deadline:
                        more_due = False
                        result.backlog_remaining = True
                        logger.warning(
                            "%s reached max_run_duration_seconds=%s; the next tick takes the rest",
                            JOB_CODE,
                            options.max_run_duration_seconds,
                        )
                    else:
                        claimed = claim_batch(engine, options, clock(), rand)
                        # Claim again until a claim comes back empty: under SKIP LOCKED
                        # a short batch may only mean a parallel runner held some rows.
                        more_due = bool(claimed)
                        if claimed:
                            result.batches += 1
                            result.claimed += len(claimed)
                            log.info("%s batch claimed: rows=%d", JOB_CODE, len(claimed))
                            if on_batch is not None:
                                on_batch()
                        for entry in claimed:
                            future = pool.submit(attempt, entry)
                            inflight[future] = entry
                if inflight:
                    collect(OUTCOME_WRITE_INTERVAL_SECONDS)
                if finished and (
                    not inflight
                    or len(finished) >= options.max_concurrency
                    or time.monotonic() - last_write >= OUTCOME_WRITE_INTERVAL_SECONDS
                ):
                    settle()
                if not inflight and not finished and (not more_due or should_stop()):
                    break
            if should_stop():
                result.status = RunStatus.CANCELLED
        except BaseException as exc:
            # Interrupted (run terminated, Ctrl-C) or the database failed: stop gracefully —
            # unstarted claims are given back, calls in flight finish and are recorded.
            result.status = RunStatus.CANCELLED if _is_interrupt(exc) else RunStatus.FAILED
            result.error = f"{type(exc).__name__}: {exc}"[:LAST_ERROR_MAX]
            result.backlog_remaining = True
            try:
                _release_unstarted(engine, inflight, clock(), result)
                while inflight:
                    collect(None)
                settle()
            except Exception:  # noqa: BLE001 — the original error is the one to report
                logger.exception("%s could not record outcomes while stopping", JOB_CODE)
            raise
        finally:
            result.duration_ms = int((time.monotonic() - started) * 1000)
    return result


def _is_interrupt(exc: BaseException) -> bool:
    return not isinstance(exc, Exception)


def _release_unstarted(
    engine: Engine,
    inflight: dict[Future[CallResult | None], ClaimedEntry],
    now: datetime,
    result: DrainResult,
) -> None:
    unstarted = [future for future in inflight if future.cancel()]
    _release(engine, [inflight.pop(future) for future in unstarted], now, result)


def _release(
    engine: Engine,
    entries: Sequence[ClaimedEntry],
    now: datetime,
    result: DrainResult,
) -> None:
    if not entries:
        return
    released = release_claims(engine, entries, now)
    result.released += released
    result.backlog_remaining = True
    log.warning(
        "%s stop requested: %d claimed rows not called, %d given back their attempt",
        JOB_CODE,
        len(entries),
        released,
    )


def _apply_outcomes(
    engine: Engine,
    outcomes: Sequence[Outcome],
    now: datetime,
    result: DrainResult,
) -> None:
    try:
        applied = record_outcomes(engine, outcomes, now)
    except Exception:  # noqa: BLE001 — rows stay Pending with their backoff; the run goes on
        log.exception(
            "%s could not record %d outcomes; the rows stay Pending and are retried after "
            "their backoff",
            JOB_CODE,
            len(outcomes),
        )
        return
    for outcome in outcomes:
        entry = outcome.entry
        if entry.id not in applied:
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
                entry.next_attempt_at.isoformat(),
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


def run_detach_retry(
    engine: Engine,
    caller: DetachCaller,
    options: DetachOptions,
    *,
    run_id: str,
    holder: str,
    clock: Clock = _utc_now,
    rand: RandomSource = random.random,
    stop_requested: threading.Event | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> DrainResult:
    """One run of the job under `LOCK_KEY`; a held lock skips the run without waiting.

    The run is recorded in pin.job_runs (its counts feed the metrics and the
    "no successful run" alert).
    """
    options.validate()
    started_at = datetime.now(UTC)
    with held_lock(engine, LOCK_KEY, options.lock_ttl_seconds, holder) as acquired:
        if not acquired:
            logger.info("%s skipped, lock held (key=%s, run=%s)", JOB_CODE, LOCK_KEY, run_id)
            result = DrainResult(status=RunStatus.SKIPPED)
            _record(engine, result, run_id, started_at)
            return result
        logger.info("%s started: jobRunId=%s", JOB_CODE, run_id)

        def keep_lock() -> None:
            if not extend_lock(engine, LOCK_KEY, options.lock_ttl_seconds, holder):
                logger.warning("%s lost its lock (%s); finishing the batch", JOB_CODE, LOCK_KEY)

        try:
            result = drain(
                engine,
                caller,
                options,
                clock=clock,
                rand=rand,
                should_stop=stop_requested.is_set if stop_requested else _never,
                on_batch=keep_lock,
                logger=logger,
            )
        except BaseException as exc:
            failed = DrainResult(
                status=RunStatus.CANCELLED if _is_interrupt(exc) else RunStatus.FAILED,
                error=f"{type(exc).__name__}: {exc}"[:LAST_ERROR_MAX],
            )
            _record(engine, failed, run_id, started_at)
            raise
        _record(engine, result, run_id, started_at)
        logger.info(
            "%s completed: status=%s succeeded=%d retried=%d quarantined=%d durationMs=%d",
            JOB_CODE,
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
        job_code=JOB_CODE,
        run_id=run_id,
        status=result.status.value,
        started_at=started_at,
        result=result.summary(),
    )


# --- reads for the sensor, the alert check, the runbook and the metrics ----------------------


# Seed alert: no successful run for more than 15 min (while work is due).
STALLED_AFTER_SECONDS = 15 * 60


@dataclass(frozen=True)
class SensorState:
    due: int
    oldest_due: datetime | None  # the earliest next_attempt_at among Pending rows
    quarantined: int
    last_success: datetime | None

    def stalled(self, now: datetime) -> bool:
        """Rows have been due for over 15 min and no run succeeded in that time."""
        limit = now - timedelta(seconds=STALLED_AFTER_SECONDS)
        overdue = self.due > 0 and self.oldest_due is not None and self.oldest_due < limit
        return overdue and (self.last_success is None or self.last_success < limit)


def sensor_state(engine: Engine) -> SensorState:
    with engine.connect() as conn:
        row = conn.execute(_query("sensor_state")).one()
    return SensorState(
        due=row.due,
        oldest_due=row.oldest_due,
        quarantined=row.quarantined,
        last_success=last_successful_run_at(engine, JOB_CODE),
    )


@dataclass(frozen=True)
class OutboxState:
    pending: int
    quarantined: int
    oldest_age_seconds: float


def outbox_state(engine: Engine) -> OutboxState:
    with engine.connect() as conn:
        row = conn.execute(_query("outbox_state")).one()
    return OutboxState(
        pending=row.pending,
        quarantined=row.quarantined,
        oldest_age_seconds=float(row.oldest_age_seconds),
    )


def quarantined_entries(engine: Engine, limit: int = 20) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [
            dict(r._mapping) for r in conn.execute(_query("quarantined_entries"), {"limit": limit})
        ]


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
        totals = conn.execute(_query("run_totals"), {"job_code": JOB_CODE}).one()
        buckets = conn.execute(
            _query("done_lag_histogram"), {"bounds": [float(b) for b in LAG_BUCKETS_SECONDS]}
        ).all()
        lag = conn.execute(_query("done_lag_totals")).one()
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


class RequeueError(ValueError):
    """The runbook action found nothing to re-enqueue."""


def requeue_quarantined(
    engine: Engine, *, entry_id: uuid.UUID | None = None, snapshot_id: uuid.UUID | None = None
) -> uuid.UUID:
    """DET-7 runbook: Quarantined → Pending with attempts 0, due now. Returns the row id."""
    if (entry_id is None) == (snapshot_id is None):
        raise RequeueError("give exactly one of entry_id / snapshot_id")
    with engine.begin() as conn:
        row = conn.execute(
            _query("requeue_quarantined"), {"id": entry_id, "snapshot_id": snapshot_id}
        ).first()
    if row is None:
        which = f"id {entry_id}" if entry_id else f"snapshot_id {snapshot_id}"
        raise RequeueError(f"no Quarantined snapshot-detach entry with {which}")
    log.info("entry re-enqueued: snapshotId=%s postId=%s", row.snapshot_id, row.post_id)
    return row.id
