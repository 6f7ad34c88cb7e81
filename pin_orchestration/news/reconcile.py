"""news-comment-reconcile (seed 000): keep news.posts.comments_count equal to the number of
the post's Visible comments.

Read top to bottom: options and their validation, then `run_reconcile`, which takes the
distributed lock, resumes from the checkpoint and walks posts in id order one batch (one
statement, one transaction) at a time until a batch comes back short, the run's time is
up, or a stop was requested.
"""

from __future__ import annotations

import functools
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

from pin_orchestration.jobruns import RunStatus, record_job_run
from pin_orchestration.locks import held_lock
from pin_orchestration.options import option
from pin_orchestration.sql import load_queries

JOB_CODE = "news-comment-reconcile"
LOCK_KEY = "Pin:lock:job:scheduled:news-comment-reconcile"
# The keyset cursor before the first post.
START_CURSOR = uuid.UUID(int=0)
# How many individual corrections a run keeps for its report (all are logged at DEBUG).
CORRECTIONS_REPORTED = 50

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
        30 * 60, "TTL of the distributed lock; must exceed the max duration"
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
        if self.lock_ttl_seconds <= self.max_run_duration_seconds:
            problems.append(
                f"lock_ttl_seconds ({self.lock_ttl_seconds}) must exceed "
                f"max_run_duration_seconds ({self.max_run_duration_seconds}) so the lock "
                "cannot expire under a live run; default is 1800"
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
class _BatchOutcome:
    candidate_count: int
    last_candidate_id: uuid.UUID | None
    # Drifted posts a live hot-path writer held, or changed after the statement's
    # snapshot: left for the next run.
    skipped_locked: int
    corrections: list[dict[str, Any]]


def checkpoint_key(scope: Scope) -> str:
    return f"{JOB_CODE}:{scope.value}"


def _queries() -> dict[str, str]:
    return load_queries("pin_orchestration.news", "reconcile.sql")


@functools.cache
def _batch_statement(scope: Scope) -> TextClause:
    queries = _queries()
    if scope == Scope.FULL_SWEEP:
        candidates, visible = queries["full_sweep_candidates"], queries["visible_in_id_range"]
    else:
        candidates, visible = queries["daily_window_candidates"], queries["visible_in_id_list"]
    # Only SQL fragments are composed here; every value is a bound parameter.
    return text(queries["reconcile_batch"].format(candidates=candidates, visible_filter=visible))


def read_checkpoint(engine: Engine, scope: Scope) -> uuid.UUID | None:
    with engine.connect() as conn:
        return conn.execute(
            text(_queries()["read_checkpoint"]), {"checkpoint_key": checkpoint_key(scope)}
        ).scalar()


@contextmanager
def sweep_connection(engine: Engine, scope: Scope) -> Iterator[Connection]:
    """One connection for a whole sweep, in autocommit: each batch is a single statement,
    hence its own transaction, with no BEGIN/COMMIT round trips around it."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        # The counter is recomputable from comments: losing the last batch to a crash costs
        # nothing, so don't wait for the WAL flush on every batch. JIT is off: the batch's
        # CTE estimates are large enough to trigger it, and compiling costs ~25 ms against
        # a ~1 ms statement.
        settings = {"synchronous_commit": "off", "jit": "off"}
        if scope == Scope.FULL_SWEEP:
            # A FullSweep batch has the same plan whatever the cursor (pkey walk, comment
            # range scan, id-array lookups): plan it once instead of every batch. DailyWindow
            # keeps custom plans, which see how recent its window is.
            settings["plan_cache_mode"] = "force_generic_plan"
        for name, value in settings.items():
            conn.execute(_SET_CONFIG, {"name": name, "value": value})
        try:
            yield conn
        finally:
            if not conn.invalidated:
                # Back to the server's defaults before the connection returns to the pool.
                conn.execute(text("RESET ALL"))


def reconcile_batch(
    conn: Connection,
    scope: Scope,
    cursor: uuid.UUID,
    batch_size: int,
    window_start: datetime | None,
) -> _BatchOutcome:
    """Reconcile the next batch after `cursor`: one statement, one transaction."""
    params: dict[str, Any] = {
        "cursor": cursor,
        "batch_size": batch_size,
        "checkpoint_key": checkpoint_key(scope),
    }
    if scope == Scope.DAILY_WINDOW:
        params["window_start"] = window_start
    row = conn.execute(_batch_statement(scope), params).one()
    return _BatchOutcome(
        candidate_count=row.candidate_count,
        last_candidate_id=row.last_candidate_id,
        skipped_locked=row.drifted_count - len(row.corrections),
        corrections=row.corrections,
    )


def run_reconcile(
    engine: Engine,
    options: ReconcileOptions,
    *,
    run_id: str,
    holder: str,
    window_anchor: datetime | None = None,
    stop_requested: threading.Event | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> ReconcileResult:
    """One reconcile run under the distributed lock.

    `window_anchor` is the instant the DailyWindow looks back from (now by default; the
    end of the partition's day for a backfill). A set `stop_requested` is honoured
    between batches: what was committed stays, the checkpoint points past it.
    """
    options.validate()
    started_at = datetime.now(UTC)
    started = time.monotonic()
    scope = Scope(options.scope)
    result = ReconcileResult(status=RunStatus.SUCCEEDED, scope=scope)
    window_start = None
    if scope == Scope.DAILY_WINDOW:
        window_start = (window_anchor or started_at) - timedelta(
            hours=options.window_lookback_hours
        )

    with held_lock(engine, LOCK_KEY, options.lock_ttl_seconds, holder) as acquired:
        if not acquired:
            logger.info("%s skipped, lock held (key=%s, run=%s)", JOB_CODE, LOCK_KEY, run_id)
            result.status = RunStatus.SKIPPED
            _finish(engine, result, run_id, started, started_at)
            return result

        cursor = read_checkpoint(engine, scope)
        result.start_after_post_id = cursor
        logger.info(
            "%s started: jobRunId=%s scope=%s cursor=%s window_start=%s batch_size=%d",
            JOB_CODE,
            run_id,
            scope.value,
            cursor,
            window_start,
            options.batch_size,
        )
        cursor = cursor or START_CURSOR
        with sweep_connection(engine, scope) as conn:
            while True:
                if stop_requested is not None and stop_requested.is_set():
                    result.status = RunStatus.CANCELLED
                    result.backlog_remaining = True
                    logger.warning("%s cancelled between batches; committed work kept", JOB_CODE)
                    break
                try:
                    batch = reconcile_batch(conn, scope, cursor, options.batch_size, window_start)
                except Exception as exc:  # noqa: BLE001 — recorded, reported, and re-raised by callers
                    result.status = RunStatus.FAILED
                    result.error = f"{type(exc).__name__}: {exc}"[:512]
                    result.backlog_remaining = True
                    logger.exception(
                        "%s batch after %s failed; earlier batches stay committed", JOB_CODE, cursor
                    )
                    break
                if batch.candidate_count == 0:
                    break
                result.batches_processed += 1
                result.posts_reconciled += batch.candidate_count - batch.skipped_locked
                result.drift_corrected += len(batch.corrections)
                result.last_post_id = batch.last_candidate_id
                room = CORRECTIONS_REPORTED - len(result.corrections)
                result.corrections.extend(batch.corrections[: max(room, 0)])
                logger.info(
                    "%s batch processed: rows=%d corrected=%d skipped_locked=%d",
                    JOB_CODE,
                    batch.candidate_count,
                    len(batch.corrections),
                    batch.skipped_locked,
                )
                for c in batch.corrections:
                    logger.debug("drift corrected: post %s %s→%s", c["post_id"], c["from"], c["to"])
                if batch.candidate_count < options.batch_size:
                    break
                cursor = batch.last_candidate_id
                # Checked after a batch, so even a tiny budget makes progress every run.
                if time.monotonic() - started >= options.max_run_duration_seconds:
                    result.backlog_remaining = True
                    logger.warning(
                        "%s reached max_run_duration_seconds=%s; the next run resumes after %s",
                        JOB_CODE,
                        options.max_run_duration_seconds,
                        cursor,
                    )
                    break

        _finish(engine, result, run_id, started, started_at)
        logger.info(
            "%s completed: status=%s postsReconciled=%d driftCorrected=%d batches=%d "
            "backlogRemaining=%s durationMs=%d",
            JOB_CODE,
            result.status.value,
            result.posts_reconciled,
            result.drift_corrected,
            result.batches_processed,
            result.backlog_remaining,
            result.duration_ms,
        )
        return result


def _finish(
    engine: Engine, result: ReconcileResult, run_id: str, started: float, started_at: datetime
) -> None:
    result.duration_ms = int((time.monotonic() - started) * 1000)
    record_job_run(
        engine,
        job_code=JOB_CODE,
        run_id=run_id,
        status=result.status.value,
        started_at=started_at,
        result=result.summary(),
    )
