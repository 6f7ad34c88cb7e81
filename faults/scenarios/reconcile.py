"""news-comment-reconcile (seed 000) under faults: a FullSweep over posts whose counters
drifted, while a hot-path writer keeps inserting comments and flipping their visibility
(each write moves the counter by ±1 in its own transaction, as the news service does),
and `pin news reconcile` runs are SIGKILLed mid-sweep or the suite's PostgreSQL restarts
under them; then runs go on until the interrupted pass completes from its checkpoint.

The independent record is the tables themselves, counted by a plain SQL query (never the
job's run results), the drift set up before the runs, and the writer's own log of the
posts it touched. Invariant `counters_match_visible`:
- after the interrupted pass completes, every post the writer never touched has its
  counter equal to its Visible comments (a checkpoint that skipped a range leaves some
  drifted); a post the writer touched is either right or still carries exactly the drift
  it had before (the sweep skips a post a live writer holds or changed after its
  snapshot and leaves it for the next run) — any other value is a stale count written
  over a concurrent write;
- after one more pass with the writer stopped, every counter is right.

Progress is a batch committed (the checkpoint row's `updated_at`, stamped by every batch,
also the one that completes a pass). After a fault the scenario waits until the faulted
run's lock has expired before it reads where the pass stands: a SIGKILLed client's
server-side slice may still commit batches for a moment after the kill (mistaking those
for the next run's progress, while that run had skipped on the held lock, once left the
scenario waiting 120 s for a run that did not exist); past its lock's TTL the fence in
every batch lets it commit nothing.

"PostgreSQL hangs": the runs reach PostgreSQL through a FaultProxy that is blackholed
mid-sweep (a hung server or network, not a restart); while the cut-off run's lock
expires, the next run connects directly and takes over; then the network heals, the old
run's held statements arrive — and change nothing (the fence) — and it stops FAILED.

Run as `python -m faults.scenarios.reconcile URL HOT_POSTS_FILE LOG` it
is the hot-path writer (until it is killed).
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import Engine, text

from faults.core import FaultContext, Outcome, scenario, wait_until
from faults.postgres import database_url_via
from faults.proxy import FaultProxy

# Small batches: many commits (and checkpoints) per second, so a kill lands mid-pass.
RUN_ARGS = [
    "news",
    "reconcile",
    "--scope=FullSweep",
    "--batch-size=20",
    # A SIGKILLed run keeps the lock until its TTL ends: short, so the next run follows.
    "--lock-ttl-seconds=2",
    "--drift-alert-threshold=100000000",
]
RUN_TIMEOUT_SECONDS = 120.0

_SETUP = """
INSERT INTO news.posts (id, status, comments_count)
SELECT gen_random_uuid(), 'Published', 0 FROM generate_series(1, :posts);
INSERT INTO news.comments (id, post_id, status)
SELECT gen_random_uuid(), p.id,
       CASE WHEN random() < 0.8 THEN 'Visible' ELSE 'HiddenByModerator' END
FROM news.posts AS p, LATERAL generate_series(1, (random() * 6)::int + (p.id IS NULL)::int);
UPDATE news.posts AS p SET comments_count = v.n
FROM (SELECT post_id, count(*) AS n FROM news.comments WHERE status = 'Visible'
      GROUP BY post_id) AS v
WHERE v.post_id = p.id;
-- The drift the job exists for: lost increments, double decrements.
UPDATE news.posts SET comments_count = greatest(comments_count + (random() * 8)::int - 4, 0)
WHERE random() < 0.3;
"""

# The source of truth, counted independently of the job: counter minus Visible comments.
_DRIFT = text(
    """
    SELECT p.id, p.comments_count - count(c.id) FILTER (WHERE c.status = 'Visible') AS drift
    FROM news.posts AS p LEFT JOIN news.comments AS c ON c.post_id = p.id
    GROUP BY p.id
    """
)
_CHECKPOINT = text(
    "SELECT last_id, updated_at FROM pin.job_checkpoints WHERE checkpoint_key = :k"
).bindparams(k="news-comment-reconcile:FullSweep")
_LOCK_LIVE = text(
    "SELECT count(*) FROM pin.distributed_locks WHERE lock_key = :k AND expires_at > now()"
).bindparams(k="Pin:lock:job:scheduled:news-comment-reconcile")


def drift(engine: Engine) -> dict[uuid.UUID, int]:
    with engine.connect() as conn:
        return {row.id: row.drift for row in conn.execute(_DRIFT)}


def checkpoint(engine: Engine) -> tuple[bool, uuid.UUID | None]:
    """(a pass has a checkpoint row, where it stands: None once the pass completed)."""
    try:
        with engine.connect() as conn:
            row = conn.execute(_CHECKPOINT).first()
    except Exception:  # noqa: BLE001 — PostgreSQL is restarting
        return False, None
    return (row is not None, row.last_id if row is not None else None)


def last_batch_at(engine: Engine) -> object:
    """When the last batch committed (None before the first; "?" while unreachable)."""
    try:
        with engine.connect() as conn:
            row = conn.execute(_CHECKPOINT).first()
    except Exception:  # noqa: BLE001 — PostgreSQL is restarting
        return "?"
    return row.updated_at if row is not None else None


def lock_expired(engine: Engine) -> bool:
    try:
        with engine.connect() as conn:
            return conn.execute(_LOCK_LIVE).scalar_one() == 0
    except Exception:  # noqa: BLE001 — PostgreSQL is restarting
        return False


class Sweep:
    def __init__(self, ctx: FaultContext, posts: int) -> None:
        from pin_orchestration.platform.db import create_db_engine

        self.ctx = ctx
        self.url = ctx.postgres.create_database("reconcile")
        self.engine = create_db_engine(self.url)
        with self.engine.begin() as conn:
            for statement in filter(str.strip, _SETUP.split(";\n")):
                conn.execute(text(statement), {"posts": posts})
        self.initial = drift(self.engine)
        self.env = ctx.pin_env(self.url)
        self.runs = 0
        self.touched_log = ctx.workdir / "touched.log"
        hot = ctx.rng.sample(sorted(self.initial), k=max(len(self.initial) // 20, 1))
        hot_file = ctx.workdir / "hot-posts"
        hot_file.write_text("\n".join(map(str, hot)))
        self.writer = ctx.spawn(
            ["-m", __name__, self.url, str(hot_file), str(self.touched_log)],
            self.env,
            name="writer",
        )

    def spawn_run(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.runs += 1
        return self.ctx.spawn_pin(RUN_ARGS, env or self.env, name=f"run{self.runs}")

    def committed_since(self, since: object) -> bool:
        return last_batch_at(self.engine) not in (since, "?")

    def wait_for_progress(self, since: object, what: str) -> float:
        """Until a batch committed after the one stamped `since`."""
        return wait_until(
            lambda: self.committed_since(since),
            timeout=RUN_TIMEOUT_SECONDS,
            every=0.02,
            what=what,
        )

    def wait_until_faulted_run_is_fenced(self) -> object:
        """Until the faulted run's lock expired (from then on every batch of it changes
        nothing); returns the stamp of the last batch committed by then."""
        wait_until(
            lambda: lock_expired(self.engine),
            timeout=RUN_TIMEOUT_SECONDS,
            every=0.05,
            what="the faulted run's lock expired",
        )
        return last_batch_at(self.engine)

    def resume(self, since: object) -> subprocess.Popen[bytes]:
        """Runs, as the schedule would start them, until one commits a batch after the
        one stamped `since`; returns that run."""
        began = time.monotonic()
        while True:
            run = self.spawn_run()
            wait_until(
                lambda run=run: self.committed_since(since) or run.poll() is not None,
                timeout=RUN_TIMEOUT_SECONDS,
                every=0.02,
                what="a run after the fault",
            )
            if self.committed_since(since):
                return run
            if time.monotonic() - began > RUN_TIMEOUT_SECONDS:
                raise TimeoutError(f"no batch after the fault within {RUN_TIMEOUT_SECONDS} s")

    def complete_pass(self) -> None:
        """Runs, one after another, until the pass in progress completes."""
        while True:
            run = self.spawn_run()
            run.wait(timeout=RUN_TIMEOUT_SECONDS)
            present, last_id = checkpoint(self.engine)
            if run.returncode == 0 and present and last_id is None:
                return

    def touched(self) -> set[uuid.UUID]:
        lines = self.touched_log.read_text().split() if self.touched_log.exists() else []
        return {uuid.UUID(line) for line in lines if len(line) == 36}


def check_counters(sweep: Sweep, outcome: Outcome) -> None:
    sweep.complete_pass()
    sweep.ctx.sigkill(sweep.writer)  # its open transaction rolls back: the record holds
    touched = sweep.touched()
    after_pass = drift(sweep.engine)
    missed = [p for p, d in after_pass.items() if d and p not in touched]
    stale = [p for p, d in after_pass.items() if d and p in touched and d != sweep.initial[p]]
    outcome.check(
        "counters_match_visible",
        not missed,
        f"after the resumed pass {len(missed)} untouched posts still drifted, "
        f"e.g. {[(str(p), after_pass[p]) for p in missed[:3]]}",
    )
    outcome.check(
        "counters_match_visible",
        not stale,
        f"{len(stale)} posts written concurrently got a stale count, e.g. "
        f"{[(str(p), sweep.initial[p], after_pass[p]) for p in stale[:3]]}",
    )
    # The next run: what the pass left for it (posts a live writer held) it must fix.
    sweep.complete_pass()
    final = drift(sweep.engine)
    wrong = [p for p, d in final.items() if d]
    outcome.check(
        "counters_match_visible",
        not wrong,
        f"after the next pass {len(wrong)} counters differ from Visible comments, "
        f"e.g. {[(str(p), final[p]) for p in wrong[:3]]}",
    )
    outcome.lost = len(set(missed) | set(wrong))
    outcome.duplicated = 0  # an absolute assignment: nothing here can happen twice
    # Posts checked by the last pass plus the hot-path writes made during the runs.
    outcome.operations = len(final) + len(sweep.touched_log.read_text().split())


def _run(ctx: FaultContext, fault: str, *, kills: int, restarts: int) -> Outcome:
    outcome = Outcome(job="reconcile", fault=fault)
    sweep = Sweep(ctx, posts=ctx.scale(30_000, 60_000))
    run = sweep.spawn_run()
    for number in range(kills + restarts):
        before = last_batch_at(sweep.engine)
        sweep.wait_for_progress(before, "a run's next batch")
        time.sleep(ctx.rng.uniform(0.0, 0.3))  # a random moment mid-sweep
        faulted_at = time.monotonic()
        if number < kills:
            if run.poll() is None:
                ctx.sigkill(run)
                outcome.faults_injected += 1
        else:
            sweep.engine.dispose()
            ctx.postgres.restart(down_seconds=ctx.rng.uniform(0.0, 1.0))
            outcome.faults_injected += 1
            run.wait(timeout=RUN_TIMEOUT_SECONDS)
        # Read once the faulted run can commit nothing more.
        at_fault = sweep.wait_until_faulted_run_is_fenced()
        # The next run resumes from the checkpoint; recovered once it commits a batch
        # after the fault (the first batch of a fresh pass, if that one ended).
        run = sweep.resume(at_fault)
        outcome.recovered_after(time.monotonic() - faulted_at)
    run.wait(timeout=RUN_TIMEOUT_SECONDS)
    check_counters(sweep, outcome)
    sweep.engine.dispose()
    return outcome


@scenario("reconcile-sigkill", job="reconcile", fault="SIGKILL of `pin news reconcile`")
def runs_killed(ctx: FaultContext) -> Outcome:
    return _run(ctx, "SIGKILL of `pin news reconcile`", kills=ctx.scale(2, 10), restarts=0)


@scenario("reconcile-pg-restart", job="reconcile", fault="PostgreSQL restarted")
def database_restarted(ctx: FaultContext) -> Outcome:
    return _run(ctx, "PostgreSQL restarted", kills=0, restarts=ctx.scale(1, 4))


@scenario("reconcile-pg-hang", job="reconcile", fault="PostgreSQL hangs (blackholed)")
def database_hung(ctx: FaultContext) -> Outcome:
    outcome = Outcome(job="reconcile", fault="PostgreSQL hangs (blackholed)")
    sweep = Sweep(ctx, posts=ctx.scale(30_000, 60_000))
    with FaultProxy(*ctx.postgres.tcp_address) as proxy:
        cut_off_env = ctx.pin_env(database_url_via(sweep.url, proxy))
        for _ in range(ctx.scale(1, 3)):
            before = last_batch_at(sweep.engine)
            cut_off = sweep.spawn_run(cut_off_env)
            sweep.wait_for_progress(before, "a batch of the run behind the proxy")
            time.sleep(ctx.rng.uniform(0.0, 0.3))
            if cut_off.poll() is not None:
                continue  # its pass was done before the fault: nothing to cut off
            hung_at = time.monotonic()
            proxy.set_mode("hang")
            outcome.faults_injected += 1
            # Its lock expires while it gets no answer; a run that reaches PostgreSQL
            # takes over and works beside the hung one.
            at_fault = sweep.wait_until_faulted_run_is_fenced()
            run = sweep.resume(at_fault)
            outcome.recovered_after(time.monotonic() - hung_at)
            proxy.set_mode("pass")  # the held statements arrive, after the takeover
            cut_off.wait(timeout=RUN_TIMEOUT_SECONDS)
            outcome.check(
                "stale_holder_stops",
                cut_off.returncode == 1,
                f"the run cut off past its lock's TTL exited {cut_off.returncode}, "
                "not FAILED on its lost lock",
            )
            run.wait(timeout=RUN_TIMEOUT_SECONDS)
    check_counters(sweep, outcome)
    sweep.engine.dispose()
    return outcome


# --- the hot-path writer -----------------------------------------------------------------------


def write_hot_path(database_url: str, hot_posts: Path, touched_log: Path) -> None:
    """What the news service does on every comment: the comment and the counter's ±1 in
    one transaction. Runs until killed; rides out a database restart."""
    from pin_orchestration.platform.db import create_db_engine

    engine = create_db_engine(database_url)
    posts = hot_posts.read_text().split()
    rng = random.Random()
    with touched_log.open("a", buffering=1) as out:
        while True:
            post = rng.choice(posts)
            try:
                with engine.begin() as conn:
                    flipped = None
                    if rng.random() < 0.5:
                        flipped = conn.execute(
                            text(
                                "UPDATE news.comments SET updated_at = now(), status = "
                                "CASE status WHEN 'Visible' THEN 'HiddenByModerator' "
                                "ELSE 'Visible' END "
                                "WHERE id = (SELECT id FROM news.comments WHERE post_id = :p "
                                "ORDER BY random() LIMIT 1) RETURNING status"
                            ),
                            {"p": post},
                        ).scalar()
                    if flipped is None:
                        conn.execute(
                            text(
                                "INSERT INTO news.comments (id, post_id, status) "
                                "VALUES (gen_random_uuid(), :p, 'Visible')"
                            ),
                            {"p": post},
                        )
                    delta = -1 if flipped == "HiddenByModerator" else 1
                    # Logged before the commit: a post touched by a rolled-back write is
                    # only excused, never blamed.
                    out.write(f"{post}\n")
                    conn.execute(
                        text(
                            "UPDATE news.posts SET comments_count = comments_count + :d "
                            "WHERE id = :p"
                        ),
                        {"d": delta, "p": post},
                    )
            except Exception:  # noqa: BLE001 — the database is restarting: write on after it
                time.sleep(0.05)


if __name__ == "__main__":
    write_hot_path(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
