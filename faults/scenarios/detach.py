"""news-snapshot-detach-retry (seed 001) under faults: outbox entries for snapshots are
drained by `pin detach run` ticks against the selections stand-in behind a FaultProxy,
while the runs are SIGKILLed, the API is cut / hung past the timeout / reset / slowed,
the suite's PostgreSQL restarts, the runs' clock jumps, or two runners overlap.

The independent record is the stand-in's own log of calls (arrival, end, answer, one line
per request it served) and the moment PostgreSQL itself saw each entry turn Done (a
trigger in the scenario's private database, the server's clock_timestamp()), never the
job's run counters. Invariants:
- `every_entry_settled`: after recovery (API healthy) no entry is Pending; Quarantined is
  the design's outcome only after max_attempts failed calls (set far above what the
  outages can use, so none is expected: `quarantined_by_design_only` says which);
- `each_snapshot_detached`: every snapshot has a 2xx answer in the stand-in's log; calls
  for it beyond the first 2xx are redeliveries (at-least-once after a crash);
- `done_never_called_again`: no call for a snapshot arrives after its entry turned Done;
- `one_call_at_a_time`: a snapshot's calls never overlap — a claim leases its row for the
  call's whole timeout, so a second claim while a call is in flight is a duplicate the
  design promises not to make.
- `one_claim_per_attempt`: every claim stamp raises the row's attempts by one (a trigger
  logs each stamp): two claimers never stamp one attempt, even when both read the row.

Run as `python -m faults.scenarios.detach URL SELECTIONS_URL MODE
[CLOCK_FILE]` it is one runner: MODE `locked` is `pin detach run`'s run_detach_retry with
its wall clock off by the offset read from CLOCK_FILE (`skew_wall_clock`); MODE `unlocked`
drains without the job's lock — the failover case where a runner that lost its lock
overlaps the next one — until no entry is Pending.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from subprocess import Popen
from typing import Any

from sqlalchemy import Engine, text

from faults.clock import JumpingClock
from faults.core import FaultContext, Outcome, scenario, wait_until
from faults.proxy import FaultProxy
from pin_orchestration.devstack.standins.selections import SelectionsStandIn

CALL_TIMEOUT_SECONDS = 1.5
# Long enough that several runs' claims interleave with the calls in flight.
STANDIN_LATENCY_SECONDS = 0.1
# Far above what an outage of a few seconds can use up at a ≤ 2 s backoff: a Quarantined
# entry here would mean the policy quarantined something it should have retried.
MAX_ATTEMPTS = 40
RUN_OPTIONS = {
    "batch_size": 10,
    "max_concurrency": 4,
    "backoff_base_seconds": 0.5,
    "backoff_factor": 2.0,
    "backoff_cap_seconds": 2.0,
    "backoff_jitter_ratio": 0.1,
    "max_attempts": MAX_ATTEMPTS,
    # A SIGKILLed run keeps the lock until its TTL ends: short, so the next tick follows.
    "lock_ttl_seconds": 3.0,
    "max_run_duration_seconds": 60.0,
}
SETTLE_TIMEOUT_SECONDS = 90.0

_DONE_LOG = """
CREATE TABLE public.faults_done_log (snapshot_id uuid NOT NULL, done_at timestamptz NOT NULL);
CREATE FUNCTION public.faults_log_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.faults_done_log VALUES (NEW.snapshot_id, clock_timestamp());
    RETURN NEW;
END $$;
CREATE TRIGGER faults_done AFTER UPDATE OF status ON news.snapshot_detach_outbox
FOR EACH ROW WHEN (NEW.status = 'Done' AND OLD.status <> 'Done')
EXECUTE FUNCTION public.faults_log_done();
CREATE TABLE public.faults_claim_log (
    id uuid NOT NULL, old_attempts integer NOT NULL, new_attempts integer NOT NULL
);
CREATE FUNCTION public.faults_log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.faults_claim_log VALUES (NEW.id, OLD.attempts, NEW.attempts);
    RETURN NEW;
END $$;
-- The claim stamp (queries.sql mark_claimed) is the one statement that sets a lease.
CREATE TRIGGER faults_claim AFTER UPDATE ON news.snapshot_detach_outbox
FOR EACH ROW WHEN (strpos(current_query(), 'lease_seconds') > 0)
EXECUTE FUNCTION public.faults_log_claim();
"""


@dataclass(frozen=True)
class Call:
    snapshot_id: str
    arrived: float  # epoch seconds, the machine's clock (never the job's injected one)
    ended: float
    status: int


class RecordingSelections(SelectionsStandIn):
    """The selections stand-in, keeping its own log of every detach it served."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log: list[Call] = []
        self._log_lock = threading.Lock()
        # A connection reset by the fault proxy is the injected fault, not a server error
        # worth a traceback on the suite's output.
        self._server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]

    def detach(self, snapshot_id: str) -> tuple[int, dict[str, Any]]:
        arrived = time.time()
        status, body = super().detach(snapshot_id)
        with self._log_lock:
            self.log.append(Call(snapshot_id, arrived, time.time(), status))
        return status, body

    def served(self) -> list[Call]:
        with self._log_lock:
            return list(self.log)

    def detached_since(self, moment: float) -> int:
        return sum(1 for c in self.served() if c.arrived > moment and 200 <= c.status < 300)


def _cli_options() -> list[str]:
    args = [f"--{name.replace('_', '-')}={value}" for name, value in RUN_OPTIONS.items()]
    return [*args, f"--detach-call-timeout-seconds={CALL_TIMEOUT_SECONDS}"]


def prepare(engine: Engine, entries: int) -> list[str]:
    """The done-time trigger, then `entries` outbox rows (the owning operation's enqueue)."""
    from pin_orchestration.news.snapshot_detach.outbox import enqueue_snapshot_detach

    with engine.begin() as conn:
        conn.exec_driver_sql(_DONE_LOG)
        snapshots = [uuid.uuid4() for _ in range(entries)]
        for number, snapshot in enumerate(snapshots):
            # A handful of posts, several snapshots each, as set-blocks produces them.
            post = uuid.UUID(int=number // 5 + 1)
            enqueue_snapshot_detach(conn, snapshot, post, "BlockReplaced")
    return [str(s) for s in snapshots]


def _statuses(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, count(*) FROM news.snapshot_detach_outbox GROUP BY status")
        ).all()
    return {status: count for status, count in rows}


def _retrying(engine: Engine) -> int:
    """Entries that failed and wait, Pending, for their next attempt."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM news.snapshot_detach_outbox "
                "WHERE status = 'Pending' AND attempts > 0"
            )
        ).scalar_one()


def _pending(engine: Engine) -> int:
    try:
        return _statuses(engine).get("Pending", 0)
    except Exception:  # noqa: BLE001 — PostgreSQL is restarting: not settled yet
        return -1


class Ticks:
    """`pin detach run` again and again, as the sensor's ticks would launch it: each run
    drains what is due and exits; the next one starts when it has ended (or was killed)."""

    def __init__(self, ctx: FaultContext, args: list[str], env: dict[str, str]) -> None:
        self._ctx, self._args, self._env = ctx, args, env
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.current: Popen[bytes] | None = None
        self.started_at = 0.0
        self.runs = 0
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.runs += 1
                self.current = self._ctx.spawn(self._args, self._env, name=f"run{self.runs}")
                self.started_at = time.time()
                child = self.current
            child.wait()

    def start(self) -> Ticks:
        self._thread.start()
        return self

    def kill_current(self) -> bool:
        """SIGKILL the run in progress; False when it had already ended by itself."""
        with self._lock:
            child = self.current
        if child is None or child.poll() is not None:
            return False
        self._ctx.sigkill(child)
        return True

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            child = self.current
        if child is not None and child.poll() is None:
            self._ctx.sigkill(child)
        self._thread.join(10)


@dataclass
class Detach:
    ctx: FaultContext
    engine: Engine
    url: str
    selections: RecordingSelections
    proxy: FaultProxy
    snapshots: list[str]

    def env(self) -> dict[str, str]:
        return self.ctx.pin_env(self.url, PIN_SELECTIONS_URL=f"http://{self.proxy.address}")

    def ticks(self, *, runner: str = "pin", clock_file: Path | None = None) -> Ticks:
        if runner == "pin":
            args = ["-m", "pin_orchestration.cli", "detach", "run", *_cli_options()]
        else:
            selections_url = f"http://{self.proxy.address}"
            args = ["-m", __name__, self.url, selections_url, runner, str(clock_file or "")]
        return Ticks(self.ctx, args, self.env()).start()

    def wait_for_calls(self, since: float, what: str) -> float:
        """Wait for a detach after `since`, or for nothing left Pending: the last entries
        may settle between a caller's look at the outbox and this wait."""
        return wait_until(
            lambda: self.selections.detached_since(since) > 0 or _pending(self.engine) == 0,
            timeout=60,
            what=what,
        )

    def wait_for_backoff(self, what: str) -> float:
        """Wait until an entry sits in its backoff (failed, Pending again), or nothing is
        left Pending."""
        return wait_until(
            lambda: _retrying(self.engine) > 0 or _pending(self.engine) == 0,
            timeout=60,
            every=0.02,
            what=what,
        )

    def recovered(self, outcome: Outcome, since: float, what: str) -> bool:
        """Count the fault just injected and wait for a detach after it; False when
        nothing is left Pending (the next fault would hit an idle job)."""
        outcome.faults_injected += 1
        if _pending(self.engine) == 0:
            return False
        outcome.recovered_after(self.wait_for_calls(since, what))
        return True

    def wait_settled(self) -> float:
        return wait_until(
            lambda: _pending(self.engine) == 0,
            timeout=SETTLE_TIMEOUT_SECONDS,
            every=0.2,
            what="every outbox entry settled after the faults",
        )


@contextmanager
def detach_world(ctx: FaultContext, entries: int) -> Iterator[Detach]:
    from pin_orchestration.platform.db import create_db_engine

    url = ctx.postgres.create_database("detach")
    engine = create_db_engine(url)
    selections = RecordingSelections(latency_seconds=STANDIN_LATENCY_SECONDS).start()
    try:
        snapshots = prepare(engine, entries)
        with FaultProxy("127.0.0.1", int(selections.url.rsplit(":", 1)[1])) as proxy:
            yield Detach(ctx, engine, url, selections, proxy, snapshots)
    finally:
        selections.stop()
        engine.dispose()


def check_invariants(world: Detach, outcome: Outcome) -> None:
    calls = world.selections.served()
    with world.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT snapshot_id, status, attempts FROM news.snapshot_detach_outbox")
        ).all()
        done_at = {
            str(s): t.timestamp()
            for s, t in conn.execute(text("SELECT snapshot_id, done_at FROM faults_done_log"))
        }
        restamped = conn.execute(
            text(
                "SELECT id, old_attempts, new_attempts FROM faults_claim_log "
                "WHERE new_attempts <> old_attempts + 1"
            )
        ).all()
    outcome.operations = len(calls)
    by_snapshot: dict[str, list[Call]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.arrived):
        by_snapshot[call.snapshot_id].append(call)

    pending = [str(r.snapshot_id) for r in rows if r.status == "Pending"]
    quarantined = [r for r in rows if r.status == "Quarantined"]
    outcome.check(
        "every_entry_settled",
        not pending,
        f"{len(pending)} of {len(rows)} entries still Pending, e.g. {pending[:3]}",
    )
    early = [str(r.snapshot_id) for r in quarantined if r.attempts < MAX_ATTEMPTS]
    outcome.check(
        "quarantined_by_design_only",
        not early,
        f"{len(early)} entries Quarantined before {MAX_ATTEMPTS} attempts: {early[:3]}",
    )

    never = [s for s in world.snapshots if not any(c.status == 200 for c in by_snapshot[s])]
    outcome.lost = len(never) + len(pending)
    outcome.check(
        "each_snapshot_detached",
        not never,
        f"{len(never)} snapshots never answered 2xx by selections, e.g. {never[:3]}",
    )
    outcome.redeliveries = sum(
        max(sum(1 for c in by_snapshot[s] if c.status == 200) - 1, 0) for s in world.snapshots
    )

    after_done = [
        f"{s} called {c.arrived - done_at[s]:.3f} s after Done"
        for s in world.snapshots
        if s in done_at
        for c in by_snapshot[s]
        if c.arrived > done_at[s]
    ]
    outcome.check(
        "done_never_called_again",
        not after_done,
        f"{len(after_done)} calls after the entry was Done: {after_done[:3]}",
    )
    overlapping = [
        f"{s}: a call at {b.arrived:.3f} while one ran until {a.ended:.3f}"
        for s in world.snapshots
        for a, b in zip(by_snapshot[s], by_snapshot[s][1:], strict=False)
        if b.arrived < a.ended
    ]
    outcome.duplicated = len(after_done) + len(overlapping)
    outcome.check(
        "one_call_at_a_time",
        not overlapping,
        f"{len(overlapping)} overlapping calls for one snapshot: {overlapping[:3]}",
    )
    outcome.check(
        "one_claim_per_attempt",
        not restamped,
        f"{len(restamped)} claim stamps that did not raise attempts by one (a second claim "
        f"of one attempt): {[f'{r.id} {r.old_attempts}->{r.new_attempts}' for r in restamped[:3]]}",
    )
    log_summary = f"{len(quarantined)} Quarantined (by max_attempts={MAX_ATTEMPTS})"
    (world.ctx.workdir / "summary.txt").write_text(log_summary + "\n")


def _recover(world: Detach, outcome: Outcome, ticks: Ticks) -> None:
    """Let the ticks drain everything with the API healthy, stop them, check."""
    try:
        world.wait_settled()
    finally:
        ticks.stop()
    check_invariants(world, outcome)


# --- scenarios -------------------------------------------------------------------------------


@scenario("detach-sigkill", job="detach", fault="SIGKILL of `pin detach run`")
def runs_killed(ctx: FaultContext) -> Outcome:
    outcome = Outcome(job="detach", fault="SIGKILL of `pin detach run`")
    with detach_world(ctx, ctx.scale(50, 400)) as world:
        ticks = world.ticks()
        for _ in range(ctx.scale(2, 10)):
            # Mid-drain: once this run has had a detach answered, at a random moment.
            world.wait_for_calls(ticks.started_at, "a run's first detach")
            time.sleep(ctx.rng.uniform(0.0, 0.4))
            killed_at = time.time()
            if not ticks.kill_current():
                continue
            if not world.recovered(outcome, killed_at, "a detach after the run was killed"):
                break
        _recover(world, outcome, ticks)
    return outcome


API_FAULTS: list[tuple[str, float]] = [("down", 0.0), ("hang", 0.0), ("reset", 0.0), ("slow", 0.2)]


@scenario(
    "detach-api",
    job="detach",
    fault="selections API down, hung past the timeout, resetting, slow",
)
def api_faults(ctx: FaultContext) -> Outcome:
    outcome = Outcome(
        job="detach", fault="selections API down, hung past the timeout, resetting, slow"
    )
    with detach_world(ctx, ctx.scale(50, 400)) as world:
        ticks = world.ticks()
        for _ in range(ctx.scale(1, 3)):
            for mode, delay in API_FAULTS:
                world.wait_for_calls(time.time() - 0.5, "detaches before the next fault")
                world.proxy.set_mode(mode, delay_seconds=delay)  # type: ignore[arg-type]
                if mode == "reset":
                    world.proxy.reset_all()
                outcome.faults_injected += 1
                time.sleep(ctx.rng.uniform(1.0, 2.0) * ctx.scale(1, 2))  # the outage lasts
                if mode == "hang":
                    # Requests held on open connections must not reach selections later,
                    # long after their client gave up: the network dropped them.
                    world.proxy.reset_all()
                healed_at = time.time()
                world.proxy.set_mode("pass")
                if _pending(world.engine) == 0:
                    break
                outcome.recovered_after(
                    world.wait_for_calls(healed_at, f"a detach after the API was {mode}")
                )
        _recover(world, outcome, ticks)
    return outcome


@scenario("detach-pg-restart", job="detach", fault="PostgreSQL restarted")
def database_restarted(ctx: FaultContext) -> Outcome:
    outcome = Outcome(job="detach", fault="PostgreSQL restarted")
    with detach_world(ctx, ctx.scale(50, 400)) as world:
        ticks = world.ticks()
        for _ in range(ctx.scale(1, 4)):
            world.wait_for_calls(time.time() - 0.5, "detaches before the restart")
            time.sleep(ctx.rng.uniform(0.0, 0.3))
            world.engine.dispose()
            ctx.postgres.restart(down_seconds=ctx.rng.uniform(0.0, 1.0))
            restarted_at = time.time()
            if not world.recovered(outcome, restarted_at, "a detach after PostgreSQL restarted"):
                break
        _recover(world, outcome, ticks)
    return outcome


CLOCK_FAULT = "run's clock jumps back 1 h / ahead 1 h"
CLOCK_JUMP_SECONDS = 3600.0


def skew_wall_clock(
    offset_seconds: Callable[[], float],
    patch: Callable[[object, str, object], None] = setattr,
) -> None:
    """Make the detach package read a wall clock `offset_seconds()` off the machine's:
    every `datetime.now()` its modules call. The job must not care (it takes due times
    from PostgreSQL); the clock-jump scenario and its tests prove it does not. `patch`:
    how to set the attribute (a test passes monkeypatch.setattr to undo it)."""
    import pin_orchestration.news.snapshot_detach as package

    class SkewedDatetime(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> SkewedDatetime:  # type: ignore[override]
            moment = datetime.now(tz) + timedelta(seconds=offset_seconds())
            return cls.combine(moment.date(), moment.timetz())

    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        if getattr(module, "datetime", None) is datetime:
            patch(module, "datetime", SkewedDatetime)


@scenario("detach-clock-jump", job="detach", fault=CLOCK_FAULT)
def clock_jumps(ctx: FaultContext) -> Outcome:
    """The run's wall clock jumps back an hour, then ahead an hour, while entries sit in
    their backoff. Leases and backoffs are durations the database adds to its own now(),
    so no row is claimed early (one call at a time still holds) nor parked an hour late
    (the rows settle on time); nothing is lost or called after Done."""
    outcome = Outcome(job="detach", fault=CLOCK_FAULT)
    clock_file = ctx.workdir / "clock-offset"
    clock = JumpingClock(clock_file)
    clock.set(0)
    # Enough entries that the drain still runs at the second jump (~40 detaches a second).
    with detach_world(ctx, ctx.scale(200, 400)) as world:
        ticks = world.ticks(runner="locked", clock_file=clock_file)
        for jump in [-CLOCK_JUMP_SECONDS, CLOCK_JUMP_SECONDS] * ctx.scale(1, 3):
            # Failures first, so entries sit in their backoff when the clock leaps.
            world.selections.fail(503, count=ctx.scale(10, 50))
            world.wait_for_backoff("an entry in its backoff before the clock jumps")
            if _pending(world.engine) == 0:
                break
            clock.set(jump)
            outcome.faults_injected += 1
            time.sleep(ctx.rng.uniform(0.5, 1.5))
            clock.set(0)
            back_at = time.time()
            if _pending(world.engine) == 0:
                break
            outcome.recovered_after(
                world.wait_for_calls(back_at, "a detach after the clock came back")
            )
        try:
            world.wait_settled()
        finally:
            ticks.stop()
        check_invariants(world, outcome)
    return outcome


@scenario("detach-parallel-runners", job="detach", fault="two runners overlap, SIGKILLed")
def parallel_runners(ctx: FaultContext) -> Outcome:
    """Two runners drain without the job's lock (a failover: the old run lost its lock and
    goes on). Their first claims are lined up at a gate so both read the same due rows
    before either stamps them — the case mark_claimed's stamp condition is for — then
    they race on, and one or the other is SIGKILLed now and then."""
    outcome = Outcome(job="detach", fault="two runners overlap, SIGKILLed")
    with detach_world(ctx, ctx.scale(80, 400)) as world:
        pair: list[Ticks] = []
        try:
            with _claim_gate(world.engine) as stamps_waiting:
                pair.append(world.ticks(runner="unlocked"))
                stamps_waiting(1)
                pair.append(world.ticks(runner="unlocked"))
                stamps_waiting(2)
            for _ in range(ctx.scale(1, 6)):
                world.wait_for_calls(time.time() - 0.5, "detaches by the overlapping runners")
                time.sleep(ctx.rng.uniform(0.0, 0.4))
                killed_at = time.time()
                if not ctx.rng.choice(pair).kill_current():
                    continue
                if not world.recovered(outcome, killed_at, "a detach after a runner was killed"):
                    break
            world.wait_settled()
        finally:
            for ticks in pair:
                ticks.stop()
        check_invariants(world, outcome)
    return outcome


@contextmanager
def _claim_gate(engine: Engine) -> Iterator[Callable[[int], None]]:
    """Hold the outbox in SHARE mode: lock_due (FOR UPDATE, a ROW SHARE lock) still reads
    and ends, but mark_claimed (an UPDATE, ROW EXCLUSIVE) waits here. The caller starts
    one runner, waits (`stamps_waiting(1)`) until its stamp waits — its rows read, their
    row locks gone with its autocommit statement — starts the second, which then reads
    the same oldest due rows, waits for two stamps, and leaving the block lets both stamp
    at once."""
    conn = engine.connect()
    conn.execute(text("LOCK TABLE news.snapshot_detach_outbox IN SHARE MODE"))

    def stamps_waiting(count: int) -> None:
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
            "WHERE NOT l.granted AND l.relation = 'news.snapshot_detach_outbox'::regclass "
            "AND strpos(a.query, 'lease_seconds') > 0"
        )

        # Read on the engine: the gate's own connection is inside its transaction.
        def stamps() -> bool:
            with engine.connect() as probe:
                return probe.execute(waiting).scalar_one() >= count

        wait_until(stamps, timeout=60, every=0.02, what=f"{count} claim stamps at the gate")

    try:
        yield stamps_waiting
    finally:
        conn.rollback()
        conn.close()


# --- the runner process ----------------------------------------------------------------------


def run_runner(database_url: str, selections_url: str, mode: str, clock_file: str) -> None:
    from pin_orchestration.news.selections import SelectionsClient
    from pin_orchestration.news.snapshot_detach.policy import DetachOptions
    from pin_orchestration.news.snapshot_detach.worker import drain, run_detach_retry
    from pin_orchestration.platform.db import create_db_engine

    engine = create_db_engine(database_url)
    options = DetachOptions(**RUN_OPTIONS)  # type: ignore[arg-type]
    client = SelectionsClient(
        selections_url, None, timeout_seconds=CALL_TIMEOUT_SECONDS, pool_size=4
    )
    if mode == "locked":
        if clock_file:
            skew_wall_clock(JumpingClock(Path(clock_file)).offset)
        holder = f"faults-{uuid.uuid4().hex[:8]}"
        run_detach_retry(engine, client, options, run_id=holder, holder=holder)
        return
    # Unlocked: drain until nothing is Pending (retries wait out their backoff meanwhile).
    while _pending(engine) != 0:
        drain(engine, client, options)
        time.sleep(0.1)  # a tick's interval, not a wait for a condition


@scenario("detach-pg-hang", job="detach", fault="PostgreSQL hangs (blackholed)")
def database_hung(ctx: FaultContext) -> Outcome:
    """The runs reach PostgreSQL through a proxy that is blackholed past the lock's TTL
    (a hung server or network: no answer, no reset), then heals: the hung run's lease is
    lost in time, it stops, and the next tick drains what is left."""
    from faults.postgres import database_url_via

    outcome = Outcome(job="detach", fault="PostgreSQL hangs (blackholed)")
    with (
        detach_world(ctx, ctx.scale(50, 400)) as world,
        FaultProxy(*ctx.postgres.tcp_address) as database_proxy,
    ):
        world.url = database_url_via(world.url, database_proxy)
        ticks = world.ticks()
        for _ in range(ctx.scale(1, 3)):
            world.wait_for_calls(time.time() - 0.5, "detaches before the hang")
            time.sleep(ctx.rng.uniform(0.0, 0.3))
            database_proxy.set_mode("hang")
            time.sleep(float(RUN_OPTIONS["lock_ttl_seconds"]) * ctx.rng.uniform(1.0, 1.5))
            database_proxy.set_mode("pass")
            healed_at = time.time()
            if not world.recovered(outcome, healed_at, "a detach after PostgreSQL hung"):
                break
        _recover(world, outcome, ticks)
    return outcome


if __name__ == "__main__":
    # The run's own lines (claims, outcomes, lock) go to its log file in the workdir.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run_runner(*sys.argv[1:5])
