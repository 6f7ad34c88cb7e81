"""Randomized histories of news-comment-reconcile (issue 29), for the invariant test
(tests/news_reconcile/test_history.py, a few seeds) and its long mode
(bench/reconcile_history.py --seed N).

A history is a list of steps over a few days: comment activity that drifts counters (a
lost increment, a hide without its decrement), reconcile runs of a day's partition
through Dagster in-process, runs while hot-path writers hold posts (real connections
holding row locks for the whole run), runs cancelled by SIGTERM after a batch, runs
skipped on a held lock, a crash after a batch, retention with the clock moved forward,
backfills of several days. `check_history` then runs the owed work (plain runs until
nothing is owed) and checks:

- every post whose drift arose before a run of its day (or a FullSweep) was attempted —
  whatever became of that run — has its counter equal to its Visible comments;
- per post status, the analysts' drift frames (news/daily_drift_by_post_status of every
  day with a run) add up to what the reconcile changed (an audit trigger on news.posts),
  and their corrections to news_comment_reconcile_drift_corrected_total.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from dagster import DagsterInstance, materialize
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from pin_orchestration.analyst import (
    ReconcileValueMissing,
    drift_by_post_status,
    reconcile_runs_frame,
)
from pin_orchestration.areas import metrics_registry, retention_rules
from pin_orchestration.assets.news_reconcile import post_comment_counts
from pin_orchestration.coordination.locks import force_release_lock, try_acquire_lock
from pin_orchestration.coordination.retention import RetentionOptions, run_retention
from pin_orchestration.news import reconcile as reconcile_module
from pin_orchestration.news.reconcile import (
    RECONCILE_JOB,
    ReconcileOptions,
    Scope,
    read_backlog,
    read_checkpoint,
    run_reconcile,
)
from pin_orchestration.platform.ids import uuid7
from pin_orchestration.resources.database import DatabaseResource

MSK = ZoneInfo("Europe/Moscow")
OP = "news__post_comment_counts"
POSTS = 6
DAYS = [date(2026, 11, 20) + timedelta(days=n) for n in range(5)]
STATUSES = ("Published", "Published", "Draft", "Unpublished")

# What the reconcile changes, with the writer's mark: the hot path sets pin.writer.
AUDIT = """
CREATE TABLE IF NOT EXISTS public.history_audit (
    post_id uuid, post_status text, old_count integer, new_count integer, writer text
);
CREATE OR REPLACE FUNCTION public.history_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.comments_count <> OLD.comments_count THEN
    INSERT INTO public.history_audit VALUES (NEW.id, NEW.status, OLD.comments_count,
      NEW.comments_count, current_setting('pin.writer', true));
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS history_audit ON news.posts;
CREATE TRIGGER history_audit AFTER UPDATE ON news.posts
  FOR EACH ROW EXECUTE FUNCTION public.history_audit();
"""
RESET = """
TRUNCATE news.comments, news.posts, news.comment_reconcile_owed,
  news.comment_reconcile_run_totals, news.comment_reconcile_runs, pin.job_runs,
  pin.job_checkpoints, pin.distributed_locks, pin.retired_totals, public.history_audit
"""


# Steps. `day` indexes DAYS; `post` indexes the history's posts.
@dataclass(frozen=True)
class Drift:
    post: int
    day: int
    hide: bool  # hide a Visible comment without the decrement; else a lost increment


@dataclass(frozen=True)
class Run:
    day: int
    full_sweep: bool = False
    holding: tuple[int, ...] = ()  # posts hot-path writers hold for the whole run
    batch_size: int = 2


@dataclass(frozen=True)
class Cancelled:
    day: int
    full_sweep: bool


@dataclass(frozen=True)
class SkippedOnLock:
    day: int
    full_sweep: bool


@dataclass(frozen=True)
class Crash:
    day: int


@dataclass(frozen=True)
class Retention:
    days_forward: int


@dataclass(frozen=True)
class Backfill:
    first: int
    last: int


Step = Drift | Run | Cancelled | SkippedOnLock | Crash | Retention | Backfill

_day = st.integers(0, len(DAYS) - 1)
_post = st.integers(0, POSTS - 1)
STEP: st.SearchStrategy[Step] = st.one_of(
    st.builds(Drift, _post, _day, st.booleans()),
    st.builds(Drift, _post, _day, st.booleans()),
    st.builds(
        Run,
        _day,
        st.booleans(),
        st.lists(_post, max_size=3, unique=True).map(tuple),
        st.sampled_from([1, 2, 500]),
    ),
    st.builds(Cancelled, _day, st.booleans()),
    st.builds(SkippedOnLock, _day, st.booleans()),
    st.builds(Crash, _day),
    st.builds(Retention, st.sampled_from([100, 400])),
    st.builds(Backfill, _day, _day).map(
        lambda b: Backfill(min(b.first, b.last), max(b.first, b.last))
    ),
)
HISTORY = st.lists(STEP, min_size=3, max_size=8)


@dataclass
class World:
    engine: Engine
    db_url: str
    posts: list[uuid.UUID] = field(default_factory=list)
    # The day of each post's last drift not yet covered by an attempted run.
    uncovered: dict[int, set[int]] = field(default_factory=dict)
    runs: int = 0
    instance: DagsterInstance = field(default_factory=DagsterInstance.ephemeral)

    def setup(self) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql(AUDIT)
            conn.exec_driver_sql(RESET)
        self.posts = sorted(uuid7() for _ in range(POSTS))
        with self.engine.begin() as conn:
            for n, post in enumerate(self.posts):
                conn.execute(
                    text("INSERT INTO news.posts (id, status, comments_count) VALUES (:id, :s, 2)"),
                    {"id": post, "s": STATUSES[n % len(STATUSES)]},
                )
                for _ in range(2):
                    _insert_comment(conn, post, noon(DAYS[0]) - timedelta(days=3))
        self.uncovered = {}

    # -- coverage: a drift is owed a correct counter once a run of its day was attempted
    # after it, whatever became of that run, or a FullSweep pass began after it (a
    # FullSweep resuming a pass goes on from its cursor, seed 000: drift behind the cursor
    # is the next pass's).
    def attempted(self, day: int | None) -> None:
        for days in self.uncovered.values():
            if day is None:
                days.clear()
            else:
                days.discard(day)

    def attempting(self, day: int, full_sweep: bool, *, skipped: bool = False) -> None:
        if not full_sweep:
            self.attempted(day)
        elif skipped or read_checkpoint(self.engine, Scope.FULL_SWEEP) is None:
            # A fresh pass (a skipped FullSweep owes one from the first post).
            self.attempted(None)

    def apply(self, step: Step) -> None:
        if isinstance(step, Drift):
            self.drift(step)
        elif isinstance(step, Run):
            self.attempting(step.day, step.full_sweep)
            with hot_path_holding(self.engine, [self.posts[p] for p in step.holding], step.day):
                self.run_in_dagster(step.day, step.full_sweep, step.batch_size)
        elif isinstance(step, Cancelled):
            self.attempting(step.day, step.full_sweep)
            self.run_in_dagster(step.day, step.full_sweep, 1, terminate_after_a_batch=True)
        elif isinstance(step, SkippedOnLock):
            self.attempting(step.day, step.full_sweep, skipped=True)
            assert try_acquire_lock(self.engine, RECONCILE_JOB.lock_key, 600, "other-pod")
            try:
                outcome = self.run_in_dagster(step.day, step.full_sweep, 500)
                (check,) = outcome.get_asset_check_evaluations()
                assert not check.passed and "skipped: lock held by other-pod" in (
                    check.description or ""
                ), check
            finally:
                force_release_lock(self.engine, RECONCILE_JOB.lock_key)
        elif isinstance(step, Crash):
            self.attempting(step.day, False)
            self.crash(step.day)
        elif isinstance(step, Retention):
            run_retention(
                self.engine,
                RetentionOptions(scraping_results_days=30),
                retention_rules(),
                run_id=f"retention-{self.runs}",
                holder="history",
                now=datetime.now(UTC) + timedelta(days=step.days_forward),
            )
        elif isinstance(step, Backfill):
            for day in range(step.first, step.last + 1):
                self.attempting(day, False)
                self.run_in_dagster(day, False, 2)

    def drift(self, step: Drift) -> None:
        post = self.posts[step.post]
        with self.engine.begin() as conn:
            if step.hide:
                hidden = conn.execute(
                    text(
                        "UPDATE news.comments SET status = 'HiddenByModerator', updated_at = :at "
                        "WHERE id = (SELECT id FROM news.comments WHERE post_id = :p "
                        "AND status = 'Visible' ORDER BY id LIMIT 1)"
                    ),
                    {"p": post, "at": noon(DAYS[step.day])},
                ).rowcount
                if not hidden:
                    return
            else:
                _insert_comment(conn, post, noon(DAYS[step.day]))
        self.uncovered.setdefault(step.post, set()).add(step.day)

    def run_in_dagster(
        self, day: int, full_sweep: bool, batch_size: int, *, terminate_after_a_batch: bool = False
    ) -> Any:
        self.runs += 1
        config = {"scope": "FullSweep" if full_sweep else "DailyWindow", "batch_size": batch_size}
        with terminating_after_a_batch(terminate_after_a_batch):
            return materialize(
                [post_comment_counts],
                partition_key=DAYS[day].isoformat(),
                resources={"database": DatabaseResource(url=self.db_url)},
                run_config={"ops": {OP: {"config": config}}},
                instance=self.instance,
                raise_on_error=False,
            )

    def crash(self, day: int) -> None:
        """A run whose process dies after its first batch committed (nothing after it
        runs: no end recorded, no lock released — the lock is dropped as its TTL would)."""
        self.runs += 1
        real = reconcile_module.reconcile_slice

        def dying(*args: Any, **kwargs: Any) -> Any:
            piece = real(*args, **kwargs)
            if piece.batches:
                raise ProcessDied
            return piece

        reconcile_module.reconcile_slice = dying  # type: ignore[assignment]
        saved_slice = reconcile_module.SLICE_SECONDS
        reconcile_module.SLICE_SECONDS = 0.0
        try:
            run_reconcile(
                self.engine,
                ReconcileOptions(scope=Scope.DAILY_WINDOW, batch_size=1),
                run_id=f"crash-{self.runs}",
                holder="history",
                window_anchor=day_end(DAYS[day]),
                partition=DAYS[day].isoformat(),
            )
        except ProcessDied:
            pass
        finally:
            reconcile_module.reconcile_slice = real  # type: ignore[assignment]
            reconcile_module.SLICE_SECONDS = saved_slice
        force_release_lock(self.engine, RECONCILE_JOB.lock_key)

    def settle(self) -> None:
        """The owed work: plain runs of the last day (a FullSweep while one is pending)
        until nothing is owed."""
        for _ in range(6):
            backlog = read_backlog(self.engine)
            if not backlog.remaining:
                return
            self.run_in_dagster(len(DAYS) - 1, Scope.FULL_SWEEP in backlog.pending_passes, 500)
        raise AssertionError(f"still owed after six runs: {read_backlog(self.engine)}")


class ProcessDied(BaseException):
    """The crash: not an Exception, so nothing in the run catches it."""


def noon(day: date) -> datetime:
    return datetime.combine(day, time(12), tzinfo=MSK)


def day_end(day: date) -> datetime:
    return datetime.combine(day + timedelta(days=1), time(0), tzinfo=MSK)


def _insert_comment(conn: Any, post: uuid.UUID, at: datetime) -> None:
    conn.execute(
        text(
            "INSERT INTO news.comments (id, post_id, status, created_at, updated_at) "
            "VALUES (gen_random_uuid(), :p, 'Visible', :at, :at)"
        ),
        {"p": post, "at": at},
    )


@contextmanager
def hot_path_holding(engine: Engine, posts: list[uuid.UUID], day: int) -> Iterator[None]:
    """Hot-path writers, one connection each, that hold their post's row (a comment and
    its increment, uncommitted) for as long as the block runs, then commit: a correct
    write, which the run must neither wait for nor overwrite."""
    writers = []
    try:
        for post in posts:
            conn = engine.connect()
            writers.append(conn)
            conn.execute(text("SELECT set_config('pin.writer', 'hot', true)"))
            _insert_comment(conn, post, noon(DAYS[day]))
            conn.execute(
                text("UPDATE news.posts SET comments_count = comments_count + 1 WHERE id = :p"),
                {"p": post},
            )
        yield
    finally:
        for conn in writers:
            conn.commit()
            conn.close()


@contextmanager
def terminating_after_a_batch(enabled: bool) -> Iterator[None]:
    """SIGTERM to this process (as `dagster run terminate` sends) once a slice of one
    batch has committed."""
    if not enabled:
        yield
        return
    real = reconcile_module.reconcile_slice
    saved_slice = reconcile_module.SLICE_SECONDS
    sent: list[bool] = []

    def terminating(*args: Any, **kwargs: Any) -> Any:
        piece = real(*args, **kwargs)
        if piece.batches and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return piece

    reconcile_module.reconcile_slice = terminating  # type: ignore[assignment]
    reconcile_module.SLICE_SECONDS = 0.0
    try:
        yield
    finally:
        reconcile_module.reconcile_slice = real  # type: ignore[assignment]
        reconcile_module.SLICE_SECONDS = saved_slice


def check_history(world: World, steps: list[Step]) -> None:
    world.setup()
    for step in steps:
        world.apply(step)
    world.settle()
    engine = world.engine
    with engine.connect() as conn:
        truth = dict(
            conn.execute(
                text(
                    "SELECT p.id, p.comments_count = count(c.id) FILTER "
                    "(WHERE c.status = 'Visible') FROM news.posts AS p "
                    "LEFT JOIN news.comments AS c ON c.post_id = p.id GROUP BY p.id"
                )
            ).all()
        )
        audit = conn.execute(
            text(
                "SELECT post_status, count(*), sum(new_count - old_count) "
                "FROM public.history_audit WHERE coalesce(writer, '') <> 'hot' "
                "GROUP BY post_status ORDER BY post_status"
            )
        ).all()
    for n, post in enumerate(world.posts):
        if not world.uncovered.get(n):
            assert truth[post], (
                f"post {n} owed a reconcile is still wrong after the owed work; history: {steps}"
            )
    frames: dict[str, list[int]] = {}
    for day in DAYS:
        try:
            runs = reconcile_runs_frame(engine, day.isoformat())
        except ReconcileValueMissing:
            continue
        frame = drift_by_post_status(engine, runs, day.isoformat())
        for row in frame.itertuples():
            totals = frames.setdefault(row.post_status, [0, 0])
            totals[0] += int(row.posts_corrected)
            totals[1] += int(row.comments_count_change)
    changed = sorted((s, c, int(d)) for s, c, d in audit)
    read = sorted((s, c, d) for s, (c, d) in frames.items())
    assert changed == read, (
        f"the analysts' drift frames {read} differ from what the reconcile changed "
        f"{changed}; history: {steps}"
    )
    corrected = metrics_registry(engine).get_sample_value(
        "news_comment_reconcile_drift_corrected_total"
    )
    assert corrected == sum(c for _, c, _ in audit), (
        "news_comment_reconcile_drift_corrected_total differs from what the reconcile changed"
    )
