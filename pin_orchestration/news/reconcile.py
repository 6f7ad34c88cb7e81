"""news-comment-reconcile (seed 000): keep news.posts.comments_count equal to the number of
the post's Visible comments.

The run's options, result and pass plan are news/reconcile_plan.py; its records (the
checkpoint, the owed work, the run's row) news/reconcile_records.py. Here:
`run_reconcile`, which takes the distributed lock, drains the posts owed by earlier runs,
resumes from the checkpoint and walks posts in id order one batch (one statement, one
transaction) at a time — the loop runs server-side, in a procedure (reconcile.sql), a
slice of batches per round trip — until the pass is complete, the run's time is up, or a
stop was requested.

Nothing owed is forgotten (SPEC REC-3, issue 29): a drifted post a batch could not lock
(a hot-path writer held or changed it) and the window of a run skipped on the held lock
become owed posts (news.comment_reconcile_owed), which every run reconciles first; a pass
is recorded as begun before its first batch, so a run that dies leaves it owed too.
`read_backlog` is that durable state: what the result, the metadata and the gauges show.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, text

from pin_orchestration.coordination.jobruns import RunStatus
from pin_orchestration.coordination.locks import LockLease, list_locks, renewed_lock
from pin_orchestration.news.reconcile_plan import (
    OWED,
    OWED_LEG,
    RECONCILE_JOB,
    START_CURSOR,
    Leg,
    ReconcileConfigError,
    ReconcileOptions,
    ReconcileResult,
    Scope,
    Window,
    checkpoint_key,
    plan_pass,
)
from pin_orchestration.news.reconcile_records import (
    begin_run,
    finish_run,
    owe_skipped_run,
    read_backlog,
    read_checkpoint,
    read_checkpoint_state,
    statement,
    take_owed_full_sweep,
)
from pin_orchestration.platform import tracing

# The job's interface, wherever its parts are declared: what the assets, the CLI, the
# metrics and the tests import from here.
__all__ = [
    "RECONCILE_JOB",
    "SLICE_SECONDS",
    "START_CURSOR",
    "ReconcileConfigError",
    "ReconcileOptions",
    "ReconcileResult",
    "RunStatus",
    "Scope",
    "read_backlog",
    "read_checkpoint",
    "reconcile_slice",
    "run_reconcile",
]

# The client hands the server a slice of batches at a time: it checks for a stop request
# and the run's budget between slices, and pays one round trip per slice.
SLICE_SECONDS = 0.25
# How many individual corrections a run keeps for people to look at (its metadata, the
# `corrections` column analysts see); its totals are kept in full.
CORRECTIONS_REPORTED = 50

log = logging.getLogger(__name__)

_SET_CONFIG = text("SELECT set_config(:name, :value, false)")


@dataclass(frozen=True)
class _Slice:
    """What one call of the sweep procedure did."""

    cursor: uuid.UUID
    last_id: uuid.UUID | None
    batches: int
    candidates: int
    # Drifted posts a live hot-path writer held, or changed after the statement's
    # snapshot: left for the next run.
    skipped_locked: int
    corrections_count: int
    corrections: list[dict[str, Any]]
    reached_end: bool
    # A batch found the run's lock expired or taken over: it changed nothing.
    lock_lost: bool
    error: str | None


# A sweep procedure per kind of leg: its name and its candidate and Visible-count fragments.
_SWEEPS = {
    Scope.FULL_SWEEP: ("full_sweep", "full_sweep_candidates", "visible_in_id_range"),
    Scope.DAILY_WINDOW: ("daily_window", "daily_window_candidates", "visible_in_id_list"),
    OWED: ("owed", "owed_candidates", "visible_in_id_list"),
}


def _procedure_name(kind: str) -> str:
    return "news_reconcile_" + _SWEEPS[kind][0]


@functools.cache
def _procedure_source(kind: str) -> str:
    _, candidates, visible = _SWEEPS[kind]
    # Only SQL fragments are composed here; every value is a parameter of the procedure.
    return statement.sql("sweep_procedure").format(
        procedure=_procedure_name(kind),
        candidates=statement.sql(candidates),
        visible_filter=statement.sql(visible),
    )


@functools.cache
def _call_statement(kind: str) -> TextClause:
    return text(statement.sql("call_sweep_procedure").format(procedure=_procedure_name(kind)))


@contextmanager
def sweep_connection(engine: Engine, scope: Scope) -> Iterator[Connection]:
    """One connection for a whole sweep, in autocommit (the procedure commits each batch),
    with the scope's and the owed posts' sweep procedures created in its pg_temp."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        # The counter is recomputable from comments: losing the last batch to a crash costs
        # nothing, so don't wait for the WAL flush on every batch. JIT is off: the batch's
        # CTE estimates are large enough to trigger it, and compiling costs ~25 ms against
        # a ~1 ms statement.
        # A client that is gone (killed, cut off) is noticed within a quarter second, even
        # mid-slice: its server-side loop stops instead of running on for the slice.
        settings = {
            "synchronous_commit": "off",
            "jit": "off",
            "client_connection_check_interval": "250",
        }
        if scope == Scope.FULL_SWEEP:
            # A FullSweep batch has the same plan whatever the cursor (pkey walk, comment
            # range scan, id-array lookups): plan it once instead of every batch. DailyWindow
            # keeps custom plans, which see how recent its window is.
            settings["plan_cache_mode"] = "force_generic_plan"
        for name, value in settings.items():
            conn.execute(_SET_CONFIG, {"name": name, "value": value})
        conn.exec_driver_sql(_procedure_source(scope))
        conn.exec_driver_sql(_procedure_source(OWED))
        try:
            yield conn
        finally:
            if not conn.invalidated:
                # Back to the server's defaults before the connection returns to the pool.
                conn.execute(text("RESET ALL"))


@tracing.traced(
    f"{RECONCILE_JOB.code}.batches",
    lambda a: {"cursor": str(a["cursor"]), "batchSize": a["batch_size"]},
    lambda piece: {
        "batches": piece.batches,
        "rows": piece.candidates,
        "corrected": piece.corrections_count,
        "skippedLocked": piece.skipped_locked,
    },
)
def reconcile_slice(
    conn: Connection,
    lease: LockLease,
    scope: Scope,
    leg: Leg,
    cursor: uuid.UUID,
    batch_size: int,
    window: Window | None,
    slice_seconds: float,
    corrections_kept: int,
    run_ref: int,
    run_id: str,
) -> _Slice:
    """Reconcile batches after `cursor` in `leg` for up to `slice_seconds` (at least one
    batch), each batch its own transaction fenced by the lease's token, in one round trip;
    each batch adds to the run's record `run_ref` and to the owed posts what it skipped."""
    row = conn.execute(
        _call_statement(OWED if leg.owed else scope),
        {
            "checkpoint_key": None if leg.owed else checkpoint_key(scope),
            "batch_size": batch_size,
            "window_start": window.start if window else None,
            "window_end": window.end if window else None,
            "upper": leg.upper,
            "end_cursor": leg.end_cursor,
            "slice_seconds": slice_seconds,
            "corrections_kept": corrections_kept,
            "lock_key": lease.key,
            "lock_token": lease.token,
            "run_ref": run_ref,
            "run_id": run_id,
            "cursor": cursor,
        },
    ).one()
    return _Slice(
        cursor=row.io_cursor,
        last_id=row.io_last_id,
        batches=row.io_batches,
        candidates=row.io_candidates,
        skipped_locked=row.io_drifted - row.io_corrected,
        corrections_count=row.io_corrected,
        corrections=row.io_corrections,
        reached_end=row.io_reached_end,
        lock_lost=row.io_lock_lost,
        error=row.io_error,
    )


@tracing.traced(
    RECONCILE_JOB.code,
    lambda a: {
        "jobRunId": a["run_id"],
        "scope": str(a["options"].scope),
        "batchSize": a["options"].batch_size,
    },
    lambda result: {
        "status": result.status.value,
        "postsReconciled": result.posts_reconciled,
        "driftCorrected": result.drift_corrected,
        "batchesProcessed": result.batches_processed,
        "backlogRemaining": result.backlog_remaining,
    },
)
def run_reconcile(
    engine: Engine,
    options: ReconcileOptions,
    *,
    run_id: str,
    holder: str,
    window_anchor: datetime | None = None,
    partition: str | None = None,
    stop_requested: threading.Event | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> ReconcileResult:
    """One reconcile run under the distributed lock, renewed while it works; a lost lock
    stops it (FAILED) before its next slice.

    `window_anchor` is the end of the DailyWindow (now by default; the end of the
    partition's day for a scheduled run or a backfill): activity in [anchor − lookback,
    anchor). A set `stop_requested` is honoured between slices of batches (at most
    SLICE_SECONDS apart): what was committed stays, the checkpoint points past it.
    """
    options.validate()
    started_at = datetime.now(UTC)
    started = time.monotonic()
    scope = Scope(options.scope)
    result = ReconcileResult(status=RunStatus.SUCCEEDED, scope=scope, partition=partition)
    own_window = _own_window(scope, options, window_anchor or started_at)

    with renewed_lock(engine, RECONCILE_JOB.lock_key, options.lock_ttl_seconds, holder) as lease:
        if not lease.acquired:
            result.status = RunStatus.SKIPPED
            result.lock_holder = _holder_of(engine, RECONCILE_JOB.lock_key)
            run_ref = owe_skipped_run(engine, result, run_id, own_window, started_at)
            logger.info(
                "%s skipped, lock held (key=%s, holder=%s, run=%s); owed to the next run",
                RECONCILE_JOB.code,
                RECONCILE_JOB.lock_key,
                result.lock_holder,
                run_id,
            )
            finish_run(engine, result, run_id, run_ref, started, started_at)
            return result

        if scope == Scope.FULL_SWEEP:
            take_owed_full_sweep(engine, lease)
        checkpoint = read_checkpoint_state(engine, scope)
        legs, window = plan_pass(scope, checkpoint, own_window)
        result.start_after_post_id = checkpoint.last_id if checkpoint else None
        run_ref = begin_run(engine, lease, result, run_id, scope, checkpoint, window, started_at)
        if read_backlog(engine).owed_posts:
            # The owed posts first: they are the oldest debt. (Posts owed from here on, by
            # a run skipped meanwhile, wait for the next run.)
            legs = [OWED_LEG, *legs]
        _log_started(logger, run_id, result, window, legs, options.batch_size)
        with sweep_connection(engine, scope) as conn:
            _Sweep(
                conn,
                scope,
                window,
                options,
                started,
                stop_requested,
                lease,
                logger,
                result,
                run_ref,
                run_id,
            ).walk(legs)

        finish_run(engine, result, run_id, run_ref, started, started_at)
        _log_completed(logger, result)
        return result


def _own_window(scope: Scope, options: ReconcileOptions, end: datetime) -> Window | None:
    """A DailyWindow run's own window: comment activity in [end - lookback, end)."""
    if scope != Scope.DAILY_WINDOW:
        return None
    return Window(end - timedelta(hours=options.window_lookback_hours), end)


def _holder_of(engine: Engine, key: str) -> str | None:
    return next((lock.holder for lock in list_locks(engine) if lock.lock_key == key), None)


def _log_started(
    logger: logging.Logger | logging.LoggerAdapter[Any],
    run_id: str,
    result: ReconcileResult,
    window: Window | None,
    legs: list[Leg],
    batch_size: int,
) -> None:
    logger.info(
        "%s started: jobRunId=%s scope=%s cursor=%s window=%s legs=%d batch_size=%d",
        RECONCILE_JOB.code,
        run_id,
        result.scope.value,
        result.start_after_post_id,
        f"[{window.start.isoformat()}, {window.end.isoformat()})" if window else None,
        len(legs),
        batch_size,
    )


def _log_completed(
    logger: logging.Logger | logging.LoggerAdapter[Any], result: ReconcileResult
) -> None:
    logger.info(
        "%s completed: status=%s postsReconciled=%d driftCorrected=%d batches=%d "
        "postsSkipped=%d owedPosts=%d backlogRemaining=%s durationMs=%d",
        RECONCILE_JOB.code,
        result.status.value,
        result.posts_reconciled,
        result.drift_corrected,
        result.batches_processed,
        result.posts_skipped,
        result.owed_posts,
        result.backlog_remaining,
        result.duration_ms,
    )


@dataclass
class _Sweep:
    """A run's walk over its legs, slice by slice, until done, the budget is spent, a
    stop is requested or the lock is lost. What is left needs no flag here: the
    checkpoint and the owed posts say it, and `finish_run` reads backlog_remaining from
    them. Each step updates `result`."""

    conn: Connection
    scope: Scope
    window: Window | None
    options: ReconcileOptions
    started: float
    stop_requested: threading.Event | None
    lease: LockLease
    logger: logging.Logger | logging.LoggerAdapter[Any]
    result: ReconcileResult
    run_ref: int
    run_id: str

    def walk(self, legs: list[Leg]) -> None:
        for leg in legs:
            if not self._walk_leg(leg):
                return

    def _walk_leg(self, leg: Leg) -> bool:
        """Slices of `leg` to its end (True) or until the run stops (False)."""
        cursor = leg.after
        while True:
            if self._stopped_before_slice():
                return False
            piece = self._slice(leg, cursor)
            self._count(piece)
            if self._failed(piece):
                return False
            if piece.reached_end:
                return True
            cursor = piece.cursor
            # Checked after a slice (at least one batch), so even a tiny budget makes
            # progress every run.
            if self._out_of_time(cursor):
                return False

    def _stopped_before_slice(self) -> bool:
        if self.lease.lost.is_set():
            return self._stopped_on_a_lost_lock("committed work kept")
        if self.stop_requested is not None and self.stop_requested.is_set():
            self.result.status = RunStatus.CANCELLED
            self.logger.warning(
                "%s cancelled between batches; committed work kept", RECONCILE_JOB.code
            )
            return True
        return False

    def _slice(self, leg: Leg, cursor: uuid.UUID) -> _Slice:
        remaining = self.options.max_run_duration_seconds - (time.monotonic() - self.started)
        return reconcile_slice(
            self.conn,
            self.lease,
            self.scope,
            leg,
            cursor,
            self.options.batch_size,
            self.window,
            slice_seconds=max(min(SLICE_SECONDS, remaining), 0.0),
            corrections_kept=max(CORRECTIONS_REPORTED - len(self.result.corrections), 0),
            run_ref=self.run_ref,
            run_id=self.run_id,
        )

    def _count(self, piece: _Slice) -> None:
        result = self.result
        result.batches_processed += piece.batches
        result.posts_reconciled += piece.candidates - piece.skipped_locked
        result.posts_skipped += piece.skipped_locked
        result.drift_corrected += piece.corrections_count
        result.last_post_id = piece.last_id or result.last_post_id
        result.corrections.extend(piece.corrections)
        if piece.batches:
            self.logger.info(
                "%s batches processed: batches=%d rows=%d corrected=%d skipped_locked=%d",
                RECONCILE_JOB.code,
                piece.batches,
                piece.candidates,
                piece.corrections_count,
                piece.skipped_locked,
            )

    def _stopped_on_a_lost_lock(self, kept: str) -> bool:
        # Another runner may hold the lock now: not one more batch.
        self.result.status = RunStatus.FAILED
        self.result.error = f"lost the lock {RECONCILE_JOB.lock_key}; stopped"
        self.logger.error("%s lost its lock; stopped, %s", RECONCILE_JOB.code, kept)
        return True

    def _failed(self, piece: _Slice) -> bool:
        if piece.lock_lost:
            self.lease.mark_lost("a batch found the lock expired or taken over")
            return self._stopped_on_a_lost_lock("the batch changed nothing")
        # Lost during the slice (its renewal unanswered) while the slice's own fence still
        # passed: its batches stand, but the run stops and fails, even at the pass's end.
        if self.lease.lost.is_set():
            return self._stopped_on_a_lost_lock("committed work kept")
        if piece.error is not None:
            self.result.status = RunStatus.FAILED
            self.result.error = piece.error[:512]
            self.logger.error(
                "%s batch after %s failed (%s); earlier batches stay committed",
                RECONCILE_JOB.code,
                piece.cursor,
                piece.error,
            )
            return True
        return False

    def _out_of_time(self, cursor: uuid.UUID) -> bool:
        if time.monotonic() - self.started < self.options.max_run_duration_seconds:
            return False
        self.logger.warning(
            "%s reached max_run_duration_seconds=%s; the next run resumes after %s",
            RECONCILE_JOB.code,
            self.options.max_run_duration_seconds,
            cursor,
        )
        return True
