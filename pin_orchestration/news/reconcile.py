"""news-comment-reconcile (seed 000): keep news.posts.comments_count equal to the number of
the post's Visible comments.

Read top to bottom: options and their validation, the checkpoint and the pass plan, then
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
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, text

from pin_orchestration.coordination.jobruns import RunStatus, record_job_run
from pin_orchestration.coordination.locks import LockLease, list_locks, renewed_lock
from pin_orchestration.platform import tracing
from pin_orchestration.platform.options import option
from pin_orchestration.platform.sql import NamedQueries

JOB_CODE = "news-comment-reconcile"
LOCK_KEY = "Pin:lock:job:scheduled:news-comment-reconcile"
# The keyset cursor before the first post.
START_CURSOR = uuid.UUID(int=0)
# The keyset bound after the last post.
END_CURSOR = uuid.UUID(int=2**128 - 1)
# The client hands the server a slice of batches at a time: it checks for a stop request
# and the run's budget between slices, and pays one round trip per slice.
SLICE_SECONDS = 0.25
# How many individual corrections a run keeps for people to look at (its metadata, the
# `corrections` column analysts see); its totals are kept in full.
CORRECTIONS_REPORTED = 50
# A run's record (news.comment_reconcile_runs) until it records its end.
RUNNING = "running"
# The sweep over the owed posts (news.comment_reconcile_owed), which every run does first.
OWED = "owed"

log = logging.getLogger(__name__)

_SET_CONFIG = text("SELECT set_config(:name, :value, false)")


class Scope(StrEnum):
    DAILY_WINDOW = "DailyWindow"
    FULL_SWEEP = "FullSweep"


class ReconcileConfigError(ValueError):
    """The run's options are invalid; raised before any work is done."""


@dataclass(frozen=True)
class ReconcileOptions:
    scope: Scope = option(
        Scope.DAILY_WINDOW,
        "DailyWindow (posts with comment activity in the lookback window) "
        "or FullSweep (every post that is not Archived)",
    )
    batch_size: int = option(500, "Posts per batch (> 0)")
    max_run_duration_seconds: float = option(
        20 * 60, "Stop after this long; the next run resumes from the checkpoint"
    )
    window_lookback_hours: float = option(
        26, "DailyWindow: comment activity at or after the window's end minus this"
    )
    lock_ttl_seconds: float = option(
        30 * 60, "TTL of the distributed lock, renewed every third of it while the run works"
    )
    drift_alert_threshold: int = option(
        100, "Corrections in one run above this fail the drift check"
    )

    def validate(self) -> None:
        problems: list[str] = []
        if self.scope not in tuple(Scope):
            problems.append(
                f"scope must be one of {', '.join(s.value for s in Scope)} (got {self.scope!r})"
            )
        if self.batch_size <= 0:
            problems.append(f"batch_size must be > 0 (got {self.batch_size}); default is 500")
        if self.max_run_duration_seconds <= 0:
            problems.append(
                "max_run_duration_seconds must be > 0 "
                f"(got {self.max_run_duration_seconds}); default is 1200"
            )
        if self.scope == Scope.DAILY_WINDOW and self.window_lookback_hours <= 0:
            problems.append(
                "window_lookback_hours must be > 0 for scope DailyWindow "
                f"(got {self.window_lookback_hours}); default is 26"
            )
        if self.lock_ttl_seconds <= 0:
            problems.append(
                f"lock_ttl_seconds must be > 0 (got {self.lock_ttl_seconds}); default is 1800"
            )
        if self.drift_alert_threshold < 0:
            problems.append(
                f"drift_alert_threshold must be >= 0 (got {self.drift_alert_threshold})"
            )
        if problems:
            raise ReconcileConfigError(
                "invalid news-comment-reconcile config: " + "; ".join(problems)
            )


@dataclass
class ReconcileResult:
    status: RunStatus
    scope: Scope
    start_after_post_id: uuid.UUID | None = None
    posts_reconciled: int = 0
    drift_corrected: int = 0
    batches_processed: int = 0
    last_post_id: uuid.UUID | None = None
    backlog_remaining: bool = False
    duration_ms: int = 0
    error: str | None = None
    # Drifted posts this run could not lock (a hot-path writer held or changed them): owed.
    posts_skipped: int = 0
    # Posts owed a reconcile when the run ended (news.comment_reconcile_owed), whoever
    # left them; backlog_remaining is true while any is, or a pass is unfinished.
    owed_posts: int = 0
    # Skipped: who held the lock.
    lock_holder: str | None = None
    # The Dagster partition (day) the run reconciled, when it ran for one: what analysts
    # load `news/post_comment_counts` by.
    partition: str | None = None
    corrections: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The seed's run result, as plain JSON-able values."""
        data = asdict(self)
        data.pop("corrections")
        for key in ("start_after_post_id", "last_post_id"):
            data[key] = str(data[key]) if data[key] else None
        data["status"] = self.status.value
        data["scope"] = self.scope.value
        return data


@dataclass(frozen=True)
class Checkpoint:
    """Where an interrupted pass stands: the last post done and, for DailyWindow, the
    window the pass was started with (what it still owes)."""

    last_id: uuid.UUID
    window_start: datetime | None
    window_end: datetime | None


@dataclass(frozen=True)
class Window:
    """DailyWindow: comment activity at or after `start` and before `end`."""

    start: datetime
    end: datetime

    def union(self, other: Window) -> Window:
        return Window(min(self.start, other.start), max(self.end, other.end))


@dataclass(frozen=True)
class Leg:
    """Posts after `after` up to `upper` (inclusive); at its end the checkpoint becomes
    `end_cursor` (None: the pass is complete). The owed leg walks the owed posts and has
    no checkpoint: the owed table is its own record of what is left."""

    after: uuid.UUID
    upper: uuid.UUID
    end_cursor: uuid.UUID | None
    owed: bool = False


OWED_LEG = Leg(START_CURSOR, END_CURSOR, None, owed=True)


@dataclass(frozen=True)
class Backlog:
    """What is owed, durably: posts (news.comment_reconcile_owed) and unfinished passes
    (a checkpoint with a cursor: cut by the time limit, stopped, failed, crashed)."""

    owed_posts: int
    pending_passes: tuple[Scope, ...]

    @property
    def remaining(self) -> bool:
        return self.owed_posts > 0 or bool(self.pending_passes)


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


def checkpoint_key(scope: Scope) -> str:
    return f"{JOB_CODE}:{scope.value}"


# The mark a FullSweep skipped on the held lock leaves: a whole pass owed, which the next
# FullSweep holding the lock takes (reconcile.sql, owe_full_sweep).
OWED_FULL_SWEEP_KEY = f"{checkpoint_key(Scope.FULL_SWEEP)}:owed"


_statement = NamedQueries("pin_orchestration.news", "reconcile.sql")


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
    return _statement.sql("sweep_procedure").format(
        procedure=_procedure_name(kind),
        candidates=_statement.sql(candidates),
        visible_filter=_statement.sql(visible),
    )


@functools.cache
def _call_statement(kind: str) -> TextClause:
    return text(_statement.sql("call_sweep_procedure").format(procedure=_procedure_name(kind)))


def read_backlog(engine: Engine) -> Backlog:
    with engine.connect() as conn:
        row = conn.execute(
            _statement("backlog"),
            {"checkpoint_keys": [*(checkpoint_key(s) for s in Scope), OWED_FULL_SWEEP_KEY]},
        ).one()
    keys = {checkpoint_key(s): s for s in Scope} | {OWED_FULL_SWEEP_KEY: Scope.FULL_SWEEP}
    pending = dict.fromkeys(keys[k] for k in row.pending_passes)
    return Backlog(int(row.owed_posts), tuple(pending))


def read_checkpoint_state(engine: Engine, scope: Scope) -> Checkpoint | None:
    with engine.connect() as conn:
        row = conn.execute(
            _statement("read_checkpoint"), {"checkpoint_key": checkpoint_key(scope)}
        ).first()
    if row is None or row.last_id is None:
        return None
    return Checkpoint(row.last_id, row.window_start, row.window_end)


def read_checkpoint(engine: Engine, scope: Scope) -> uuid.UUID | None:
    state = read_checkpoint_state(engine, scope)
    return state.last_id if state else None


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
    f"{JOB_CODE}.batches",
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


def plan_pass(
    scope: Scope, checkpoint: Checkpoint | None, own_window: Window | None
) -> tuple[list[Leg], Window | None]:
    """The legs this run walks and the window it uses.

    A fresh pass walks every post once. A resumed FullSweep goes on to the end (seed). A
    resumed DailyWindow goes on to the end, then wraps around to where it resumed, with
    the union of its own window and the interrupted pass's: every post is then looked at
    with every window owed since the last completed pass, however many runs were cut.
    """
    if checkpoint is None:
        return [Leg(START_CURSOR, END_CURSOR, None)], own_window
    if scope == Scope.FULL_SWEEP or own_window is None:
        return [Leg(checkpoint.last_id, END_CURSOR, None)], own_window
    window = own_window
    if checkpoint.window_start is not None and checkpoint.window_end is not None:
        window = own_window.union(Window(checkpoint.window_start, checkpoint.window_end))
    if checkpoint.last_id == START_CURSOR:
        return [Leg(START_CURSOR, END_CURSOR, None)], window
    return [
        Leg(checkpoint.last_id, END_CURSOR, START_CURSOR),
        Leg(START_CURSOR, checkpoint.last_id, None),
    ], window


@tracing.traced(
    JOB_CODE,
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
    own_window = None
    if scope == Scope.DAILY_WINDOW:
        end = window_anchor or started_at
        own_window = Window(end - timedelta(hours=options.window_lookback_hours), end)

    with renewed_lock(engine, LOCK_KEY, options.lock_ttl_seconds, holder) as lease:
        if not lease.acquired:
            result.status = RunStatus.SKIPPED
            result.lock_holder = _holder_of(engine, LOCK_KEY)
            run_ref = _owe_skipped_run(engine, result, run_id, own_window, started_at)
            logger.info(
                "%s skipped, lock held (key=%s, holder=%s, run=%s); owed to the next run",
                JOB_CODE,
                LOCK_KEY,
                result.lock_holder,
                run_id,
            )
            _finish(engine, result, run_id, run_ref, started, started_at)
            return result

        if scope == Scope.FULL_SWEEP:
            _take_owed_full_sweep(engine, lease)
        checkpoint = read_checkpoint_state(engine, scope)
        legs, window = plan_pass(scope, checkpoint, own_window)
        result.start_after_post_id = checkpoint.last_id if checkpoint else None
        run_ref = _begin_run(engine, lease, result, run_id, scope, checkpoint, window, started_at)
        if read_backlog(engine).owed_posts:
            # The owed posts first: they are the oldest debt. (Posts owed from here on, by
            # a run skipped meanwhile, wait for the next run.)
            legs = [OWED_LEG, *legs]
        logger.info(
            "%s started: jobRunId=%s scope=%s cursor=%s window=%s legs=%d batch_size=%d",
            JOB_CODE,
            run_id,
            scope.value,
            result.start_after_post_id,
            f"[{window.start.isoformat()}, {window.end.isoformat()})" if window else None,
            len(legs),
            options.batch_size,
        )
        with sweep_connection(engine, scope) as conn:
            _sweep(
                conn,
                scope,
                legs,
                window,
                options,
                started,
                stop_requested,
                lease,
                logger,
                result,
                run_ref,
                run_id,
            )

        _finish(engine, result, run_id, run_ref, started, started_at)
        logger.info(
            "%s completed: status=%s postsReconciled=%d driftCorrected=%d batches=%d "
            "postsSkipped=%d owedPosts=%d backlogRemaining=%s durationMs=%d",
            JOB_CODE,
            result.status.value,
            result.posts_reconciled,
            result.drift_corrected,
            result.batches_processed,
            result.posts_skipped,
            result.owed_posts,
            result.backlog_remaining,
            result.duration_ms,
        )
        return result


def _holder_of(engine: Engine, key: str) -> str | None:
    return next((lock.holder for lock in list_locks(engine) if lock.lock_key == key), None)


def _record_run(
    engine: Engine,
    run_id: str,
    partition: str | None,
    scope: Scope,
    status: str,
    started_at: datetime,
) -> int:
    with engine.begin() as conn:
        return int(
            conn.execute(
                _statement("begin_run"),
                {
                    "run_id": run_id,
                    "partition": partition,
                    "scope": scope.value,
                    "status": status,
                    "started_at": started_at,
                },
            ).scalar_one()
        )


def _owe_skipped_run(
    engine: Engine,
    result: ReconcileResult,
    run_id: str,
    own_window: Window | None,
    started_at: datetime,
) -> int:
    """A run skipped on the held lock owes its work: a DailyWindow its window's posts, a
    FullSweep its pass. Returns its run record."""
    with engine.begin() as conn:
        if own_window is not None:
            conn.execute(
                _statement("owe_window"),
                {"run_id": run_id, "window_start": own_window.start, "window_end": own_window.end},
            )
        else:
            conn.execute(
                _statement("owe_full_sweep"),
                {"owed_key": OWED_FULL_SWEEP_KEY, "start_cursor": START_CURSOR},
            )
    return _record_run(
        engine, run_id, result.partition, result.scope, RunStatus.SKIPPED.value, started_at
    )


def _take_owed_full_sweep(engine: Engine, lease: LockLease) -> None:
    """Under the lock, before the checkpoint is read: a pass owed by a skipped FullSweep
    makes this run's pass start from the first post."""
    with engine.begin() as conn:
        conn.execute(
            _statement("take_owed_full_sweep"),
            {
                "owed_key": OWED_FULL_SWEEP_KEY,
                "checkpoint_key": checkpoint_key(Scope.FULL_SWEEP),
                "start_cursor": START_CURSOR,
                "lock_key": lease.key,
                "lock_token": lease.token,
            },
        )


def _begin_run(
    engine: Engine,
    lease: LockLease,
    result: ReconcileResult,
    run_id: str,
    scope: Scope,
    checkpoint: Checkpoint | None,
    window: Window | None,
    started_at: datetime,
) -> int:
    """Under the lock, before any batch: runs left 'running' by a dead process are ended,
    owed posts since archived or deleted forgiven, this run's record drawn, and a fresh
    pass recorded as begun (so a run that dies before its first batch still owes it)."""
    with engine.begin() as conn:
        conn.execute(_statement("end_dead_runs"))
        conn.execute(_statement("forgive_gone_posts"))
        if checkpoint is None:
            conn.execute(
                _statement("begin_pass"),
                {
                    "checkpoint_key": checkpoint_key(scope),
                    "start_cursor": START_CURSOR,
                    "window_start": window.start if window else None,
                    "window_end": window.end if window else None,
                    "lock_key": lease.key,
                    "lock_token": lease.token,
                },
            )
    return _record_run(engine, run_id, result.partition, scope, RUNNING, started_at)


def _sweep(
    conn: Connection,
    scope: Scope,
    legs: list[Leg],
    window: Window | None,
    options: ReconcileOptions,
    started: float,
    stop_requested: threading.Event | None,
    lease: LockLease,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    result: ReconcileResult,
    run_ref: int,
    run_id: str,
) -> None:
    """Walk the legs slice by slice until done, the budget is spent, a stop is requested
    or the lock is lost. What is left needs no flag here: the checkpoint and the owed
    posts say it, and `_finish` reads backlog_remaining from them."""
    for leg in legs:
        cursor = leg.after
        while True:
            if lease.lost.is_set():
                # Another runner may hold the lock now: not one more batch.
                result.status = RunStatus.FAILED
                result.error = f"lost the lock {LOCK_KEY}; stopped"
                logger.error("%s lost its lock; stopped, committed work kept", JOB_CODE)
                return
            if stop_requested is not None and stop_requested.is_set():
                result.status = RunStatus.CANCELLED
                logger.warning("%s cancelled between batches; committed work kept", JOB_CODE)
                return
            remaining = options.max_run_duration_seconds - (time.monotonic() - started)
            piece = reconcile_slice(
                conn,
                lease,
                scope,
                leg,
                cursor,
                options.batch_size,
                window,
                slice_seconds=max(min(SLICE_SECONDS, remaining), 0.0),
                corrections_kept=max(CORRECTIONS_REPORTED - len(result.corrections), 0),
                run_ref=run_ref,
                run_id=run_id,
            )
            result.batches_processed += piece.batches
            result.posts_reconciled += piece.candidates - piece.skipped_locked
            result.posts_skipped += piece.skipped_locked
            result.drift_corrected += piece.corrections_count
            result.last_post_id = piece.last_id or result.last_post_id
            result.corrections.extend(piece.corrections)
            if piece.batches:
                logger.info(
                    "%s batches processed: batches=%d rows=%d corrected=%d skipped_locked=%d",
                    JOB_CODE,
                    piece.batches,
                    piece.candidates,
                    piece.corrections_count,
                    piece.skipped_locked,
                )
            if piece.lock_lost:
                lease.mark_lost("a batch found the lock expired or taken over")
                result.status = RunStatus.FAILED
                result.error = f"lost the lock {LOCK_KEY}; stopped"
                logger.error("%s lost its lock; the batch changed nothing, stopped", JOB_CODE)
                return
            if piece.error is not None:
                result.status = RunStatus.FAILED
                result.error = piece.error[:512]
                logger.error(
                    "%s batch after %s failed (%s); earlier batches stay committed",
                    JOB_CODE,
                    piece.cursor,
                    piece.error,
                )
                return
            if piece.reached_end:
                break
            cursor = piece.cursor
            # Checked after a slice (at least one batch), so even a tiny budget makes
            # progress every run.
            if time.monotonic() - started >= options.max_run_duration_seconds:
                logger.warning(
                    "%s reached max_run_duration_seconds=%s; the next run resumes after %s",
                    JOB_CODE,
                    options.max_run_duration_seconds,
                    cursor,
                )
                return


def _finish(
    engine: Engine,
    result: ReconcileResult,
    run_id: str,
    run_ref: int,
    started: float,
    started_at: datetime,
) -> None:
    result.duration_ms = int((time.monotonic() - started) * 1000)
    # What is owed when the run ends, whoever owes it: the durable state, not this run's
    # view of its own pass (a crash, another scope's cut pass and owed posts count too).
    backlog = read_backlog(engine)
    result.owed_posts = backlog.owed_posts
    result.backlog_remaining = backlog.remaining
    with engine.begin() as conn:
        conn.execute(
            _statement("end_run"),
            {
                "run_ref": run_ref,
                "status": result.status.value,
                "corrections": json.dumps(result.corrections),
            },
        )
    record_job_run(
        engine,
        job_code=JOB_CODE,
        run_id=run_id,
        status=result.status.value,
        started_at=started_at,
        # The kept corrections too: analysts read them back per partition.
        result={**result.summary(), "corrections": result.corrections},
    )
