"""Locks: never two holders. Processes compete for one lock through `renewed_lock` (what
every PIN job holds while it works) and record each step they do while holding it; the
holders are SIGKILLed, and the database restarts under them. The record is the holders'
own append-only file: no two holders' steps may overlap in time.

"PostgreSQL hangs": each holder reaches PostgreSQL through its own FaultProxy, and the
current holder's is blackholed (a hung server or network: no answer, no reset). Its
renewal gets no answer; it must stop stepping before its TTL ends, since another holder
takes the lock then; healed, it competes again.

Run as `python -m faults.scenarios.locks URL KEY RECORD SECONDS` it is
one competing holder.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from faults.core import FaultContext, Outcome, scenario, wait_until
from faults.postgres import database_url_via
from faults.proxy import FaultProxy

TTL_SECONDS = 2.0
STEP_SECONDS = 0.05


def hold_and_record(database_url: str, key: str, record: Path, seconds: float) -> None:
    from pin_orchestration.coordination.locks import LockLost, renewed_lock
    from pin_orchestration.platform.db import create_db_engine

    engine = create_db_engine(database_url)
    holder = f"faults-{os.getpid()}"
    end = time.monotonic() + seconds
    with record.open("a", buffering=1) as out:
        while time.monotonic() < end:
            try:
                with renewed_lock(engine, key, TTL_SECONDS, holder) as lease:
                    if not lease.acquired:
                        time.sleep(STEP_SECONDS)
                        continue
                    while time.monotonic() < end:
                        lease.check()
                        began = time.time()
                        time.sleep(STEP_SECONDS)
                        out.write(f"{holder} {began:.6f} {time.time():.6f}\n")
            except LockLost:
                continue
            except Exception:  # the database is restarting: try again, as a job's next run
                time.sleep(STEP_SECONDS)


def read_steps(record: Path) -> list[tuple[str, float, float]]:
    steps = []
    for line in record.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # a line cut by SIGKILL mid-write is not a step
            steps.append((parts[0], float(parts[1]), float(parts[2])))
    return sorted(steps, key=lambda s: s[1])


def overlapping_steps(steps: list[tuple[str, float, float]]) -> list[str]:
    overlaps = []
    for (h1, _, e1), (h2, b2, _) in zip(steps, steps[1:], strict=False):
        if h1 != h2 and b2 < e1:
            overlaps.append(f"{h1} until {e1:.3f} and {h2} from {b2:.3f}")
    return overlaps


def judged(outcome: Outcome, record: Path) -> Outcome:
    """The invariant over the holders' record: no two holders' steps overlap."""
    steps = read_steps(record)
    outcome.operations = len(steps)
    overlaps = overlapping_steps(steps)
    outcome.duplicated = len(overlaps)
    outcome.check("single_holder", not overlaps, f"{len(overlaps)} overlaps: {overlaps[:3]}")
    return outcome


def _steps_after(record: Path, moment: float) -> int:
    return sum(1 for _, began, _ in read_steps(record) if began > moment) if record.exists() else 0


def _run(ctx: FaultContext, fault: str, *, kills: int, restarts: int) -> Outcome:
    outcome = Outcome(job="locks", fault=fault)
    url = ctx.postgres.create_database("locks")
    record = ctx.workdir / "steps.log"
    seconds = 6 + (kills + restarts) * (TTL_SECONDS + 2)
    env = ctx.pin_env(url)
    holders = [
        ctx.spawn(
            ["-m", __name__, url, "faults-lock", str(record), str(seconds)], env, name=f"h{i}"
        )
        for i in range(3)
    ]
    wait_until(lambda: _steps_after(record, 0) > 0, timeout=30, what="a first holder's step")
    for _ in range(kills):
        time.sleep(ctx.rng.uniform(0.2, 1.0))
        alive = [h for h in holders if h.poll() is None]
        # Kill whoever holds the lock now: the last one to record a step.
        last_holder = read_steps(record)[-1][0]
        victim = next((h for h in alive if f"faults-{h.pid}" == last_holder), None)
        if victim is None:
            continue
        killed_at = time.time()
        ctx.sigkill(victim)
        outcome.faults_injected += 1
        holders.append(
            ctx.spawn(
                ["-m", __name__, url, "faults-lock", str(record), str(seconds)],
                env,
                name=f"h{len(holders)}",
            )
        )
        outcome.recovered_after(
            wait_until(
                lambda at=killed_at: _steps_after(record, at) > 0,
                timeout=TTL_SECONDS * 5,
                what="the lock taken over after its holder was killed",
            )
        )
    for _ in range(restarts):
        time.sleep(ctx.rng.uniform(0.2, 1.0))
        restarted_at = time.time()
        ctx.postgres.restart(down_seconds=ctx.rng.uniform(0.0, TTL_SECONDS))
        outcome.faults_injected += 1
        outcome.recovered_after(
            wait_until(
                lambda at=restarted_at: _steps_after(record, at) > 0,
                timeout=30,
                what="a holder's step after the database restarted",
            )
        )
    ctx.stop_children()
    return judged(outcome, record)


@scenario("locks-pg-hang", job="locks", fault="PostgreSQL hangs for the holder (blackholed)")
def database_hung(ctx: FaultContext) -> Outcome:
    outcome = Outcome(job="locks", fault="PostgreSQL hangs for the holder (blackholed)")
    url = ctx.postgres.create_database("locks")
    record = ctx.workdir / "steps.log"
    hangs = ctx.scale(2, 6)
    # The holders outlive the scenario's longest run (its first step's wait, then each
    # hang's pause and takeover wait); the scenario stops them when it ends. Living
    # 4 + 6 s a hang from their own start, the last holder that could take over had
    # exited on a loaded machine, and the takeover never came.
    seconds = 30 + hangs * (1.0 + TTL_SECONDS * 10) + 10
    proxies = [FaultProxy(*ctx.postgres.tcp_address) for _ in range(3)]
    try:
        holders = {}
        for number, proxy in enumerate(proxies):
            via = database_url_via(url, proxy)
            child = ctx.spawn(
                ["-m", __name__, via, "faults-lock", str(record), str(seconds)],
                ctx.pin_env(via),
                name=f"h{number}",
            )
            holders[f"faults-{child.pid}"] = proxy
        wait_until(lambda: _steps_after(record, 0) > 0, timeout=30, what="a first holder's step")
        for _ in range(hangs):
            time.sleep(ctx.rng.uniform(0.2, 1.0))
            proxy = holders[read_steps(record)[-1][0]]
            hung_at = time.time()
            proxy.set_mode("hang")
            outcome.faults_injected += 1
            outcome.recovered_after(
                wait_until(
                    lambda at=hung_at, hung=proxy: any(
                        began > at and holders[h] is not hung for h, began, _ in read_steps(record)
                    ),
                    timeout=TTL_SECONDS * 10,
                    what="the lock taken over from a holder the database stopped answering",
                )
            )
            proxy.set_mode("pass")
        ctx.stop_children()
    finally:
        for proxy in proxies:
            proxy.close()
    return judged(outcome, record)


@scenario("locks-sigkill", job="locks", fault="SIGKILL of the holder")
def holders_killed(ctx: FaultContext) -> Outcome:
    return _run(ctx, "SIGKILL of the holder", kills=ctx.scale(2, 10), restarts=0)


@scenario("locks-pg-restart", job="locks", fault="PostgreSQL restarted")
def database_restarted(ctx: FaultContext) -> Outcome:
    return _run(ctx, "PostgreSQL restarted", kills=0, restarts=ctx.scale(1, 5))


if __name__ == "__main__":
    hold_and_record(sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4]))
