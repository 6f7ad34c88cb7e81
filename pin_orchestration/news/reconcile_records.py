"""What news-comment-reconcile keeps in the database, read and written outside the sweep:
the backlog (owed posts and unfinished passes), the checkpoint, the owed work of a skipped
run, and a run's record from its beginning to its end (news.comment_reconcile_runs and
the job-run log)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime

from sqlalchemy import Engine

from pin_orchestration.coordination.jobruns import RunStatus, record_job_run
from pin_orchestration.coordination.locks import LockLease
from pin_orchestration.news.reconcile_plan import (
    OWED_FULL_SWEEP_KEY,
    RECONCILE_JOB,
    RUNNING,
    START_CURSOR,
    Backlog,
    Checkpoint,
    ReconcileResult,
    Scope,
    Window,
    checkpoint_key,
)
from pin_orchestration.platform.sql import NamedQueries

statement = NamedQueries("pin_orchestration.news", "reconcile.sql")


def read_backlog(engine: Engine) -> Backlog:
    with engine.connect() as conn:
        row = conn.execute(
            statement("backlog"),
            {"checkpoint_keys": [*(checkpoint_key(s) for s in Scope), OWED_FULL_SWEEP_KEY]},
        ).one()
    keys = {checkpoint_key(s): s for s in Scope} | {OWED_FULL_SWEEP_KEY: Scope.FULL_SWEEP}
    pending = dict.fromkeys(keys[k] for k in row.pending_passes)
    return Backlog(int(row.owed_posts), tuple(pending))


def read_checkpoint_state(engine: Engine, scope: Scope) -> Checkpoint | None:
    with engine.connect() as conn:
        row = conn.execute(
            statement("read_checkpoint"), {"checkpoint_key": checkpoint_key(scope)}
        ).first()
    if row is None or row.last_id is None:
        return None
    return Checkpoint(row.last_id, row.window_start, row.window_end)


def read_checkpoint(engine: Engine, scope: Scope) -> uuid.UUID | None:
    state = read_checkpoint_state(engine, scope)
    return state.last_id if state else None


def record_run(
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
                statement("begin_run"),
                {
                    "run_id": run_id,
                    "partition": partition,
                    "scope": scope.value,
                    "status": status,
                    "started_at": started_at,
                },
            ).scalar_one()
        )


def owe_skipped_run(
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
                statement("owe_window"),
                {"run_id": run_id, "window_start": own_window.start, "window_end": own_window.end},
            )
        else:
            conn.execute(
                statement("owe_full_sweep"),
                {"owed_key": OWED_FULL_SWEEP_KEY, "start_cursor": START_CURSOR},
            )
    return record_run(
        engine, run_id, result.partition, result.scope, RunStatus.SKIPPED.value, started_at
    )


def take_owed_full_sweep(engine: Engine, lease: LockLease) -> None:
    """Under the lock, before the checkpoint is read: a pass owed by a skipped FullSweep
    makes this run's pass start from the first post."""
    with engine.begin() as conn:
        conn.execute(
            statement("take_owed_full_sweep"),
            {
                "owed_key": OWED_FULL_SWEEP_KEY,
                "checkpoint_key": checkpoint_key(Scope.FULL_SWEEP),
                "start_cursor": START_CURSOR,
                "lock_key": lease.key,
                "lock_token": lease.token,
            },
        )


def begin_run(
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
        conn.execute(statement("end_dead_runs"))
        conn.execute(statement("forgive_gone_posts"))
        if checkpoint is None:
            conn.execute(
                statement("begin_pass"),
                {
                    "checkpoint_key": checkpoint_key(scope),
                    "start_cursor": START_CURSOR,
                    "window_start": window.start if window else None,
                    "window_end": window.end if window else None,
                    "lock_key": lease.key,
                    "lock_token": lease.token,
                },
            )
    return record_run(engine, run_id, result.partition, scope, RUNNING, started_at)


def finish_run(
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
            statement("end_run"),
            {
                "run_ref": run_ref,
                "status": result.status.value,
                "corrections": json.dumps(result.corrections),
            },
        )
    record_job_run(
        engine,
        job_code=RECONCILE_JOB.code,
        run_id=run_id,
        status=result.status.value,
        started_at=started_at,
        # The kept corrections too: analysts read them back per partition.
        result={**result.summary(), "corrections": result.corrections},
    )
