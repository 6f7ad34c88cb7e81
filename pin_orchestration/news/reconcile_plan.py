"""news-comment-reconcile's vocabulary: the job's names, a run's options and result, the
checkpoint, the window and the legs a pass walks (`plan_pass`), the durable backlog.
The run itself is news/reconcile.py; what it records, news/reconcile_records.py."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from pin_orchestration.coordination.job_identity import JobIdentity
from pin_orchestration.coordination.jobruns import RunStatus
from pin_orchestration.platform.options import option

# Its runs of the asset from the asset page (backfills) are the job's runs too.
RECONCILE_JOB = JobIdentity("news_comment_reconcile", asset=("news", "post_comment_counts"))
# The keyset cursor before the first post.
START_CURSOR = uuid.UUID(int=0)
# The keyset bound after the last post.
END_CURSOR = uuid.UUID(int=2**128 - 1)
# A run's record (news.comment_reconcile_runs) until it records its end.
RUNNING = "running"
# The sweep over the owed posts (news.comment_reconcile_owed), which every run does first.
OWED = "owed"


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


def checkpoint_key(scope: Scope) -> str:
    return f"{RECONCILE_JOB.code}:{scope.value}"


# The mark a FullSweep skipped on the held lock leaves: a whole pass owed, which the next
# FullSweep holding the lock takes (reconcile.sql, owe_full_sweep).
OWED_FULL_SWEEP_KEY = f"{checkpoint_key(Scope.FULL_SWEEP)}:owed"


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
