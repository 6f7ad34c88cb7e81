"""The fault suite's frame: scenarios, what each one reports, the processes it starts.

A scenario drives one job through a stream of real work while injecting one kind of fault,
then checks the job's invariants against an independent record of what happened (the
target's own log of requests, the receiver's log of deliveries, the Kafka topic, the
source-of-truth tables) and returns an `Outcome`. A broken invariant is a `Violation`
named `<job>.<invariant>`; the runner prints it and exits non-zero.

"Duplicated" counts only what the design promises to do once (one result object per job,
one holder per lock, one recalc per claimed request); at-least-once deliveries (webhooks,
Kafka events, detach calls after a crash) are counted as redeliveries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from faults.postgres import SuitePostgres

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Violation:
    invariant: str  # "<job>.<invariant>", e.g. "scraping.one_result_per_job"
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


@dataclass
class Outcome:
    job: str
    fault: str
    operations: int = 0
    faults_injected: int = 0
    lost: int = 0
    duplicated: int = 0
    redeliveries: int = 0
    longest_recovery_seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0

    def check(self, invariant: str, holds: bool, detail: str) -> None:
        """Record `invariant` as broken (with `detail`) unless it `holds`."""
        if not holds:
            self.violations.append(Violation(f"{self.job}.{invariant}", detail))

    def recovered_after(self, seconds: float) -> None:
        self.longest_recovery_seconds = max(self.longest_recovery_seconds, seconds)


class FaultContext:
    """What a scenario gets: the mode, a seeded random source, the suite's PostgreSQL, a
    scratch directory, and `spawn` for processes that the suite kills when it ends."""

    def __init__(self, *, quick: bool, seed: int, postgres: SuitePostgres, workdir: Path):
        self.quick = quick
        self.seed = seed
        self.rng = random.Random(seed)
        self.postgres = postgres
        self.workdir = workdir
        self._children: list[subprocess.Popen[bytes]] = []

    def scale(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def pin_env(self, database_url: str, **extra: str) -> dict[str, str]:
        """The environment of a `pin` child: this one (PYTHONPATH included, so a broken
        build under test is the one that runs), the database, a private PIN_HOME."""
        home = self.workdir / "pin-home"
        home.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "PIN_DATABASE_URL": database_url,
            "PIN_HOME": str(home),
            "PYTHONUNBUFFERED": "1",
        }
        env.update(extra)
        return env

    def spawn_pin(
        self, args: list[str], env: dict[str, str], *, name: str
    ) -> subprocess.Popen[bytes]:
        """Start `pin ARGS` (python -m pin_orchestration.cli); see `spawn`."""
        return self.spawn(["-m", "pin_orchestration.cli", *args], env, name=name)

    def spawn(
        self, python_args: list[str], env: dict[str, str], *, name: str
    ) -> subprocess.Popen[bytes]:
        """Start `python PYTHON_ARGS` in its own process group, its output in
        workdir/NAME.log; it is SIGKILLed when the scenario ends if still alive."""
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as out:
            child = subprocess.Popen(
                [sys.executable, *python_args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children.append(child)
        return child

    @staticmethod
    def sigkill(child: subprocess.Popen[bytes]) -> None:
        """SIGKILL the child and everything in its process group (no cleanup runs)."""
        _killpg_unless_reaped(child)
        child.wait()

    @staticmethod
    def sigkill_tree(child: subprocess.Popen[bytes]) -> int:
        """SIGKILL the child and every descendant, whatever session each one started (what
        a host or container crash does to a service tree); returns how many died."""
        import psutil

        try:
            tree = [*psutil.Process(child.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        _killpg_unless_reaped(child)
        child.wait()
        psutil.wait_procs(tree, timeout=10)
        return len(tree) + 1

    def stop_children(self) -> None:
        for child in self._children:
            if child.poll() is None:
                self.sigkill_tree(child)
        self._children.clear()


def _killpg_unless_reaped(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group. Once the child is reaped (by a thread waiting on
    it) and its group is empty, the group's number may be another process's by now (PIDs
    wrap at 32768 here) and killpg would kill that one: then nothing is sent. A group with
    members left keeps its number, so those are still killed."""
    import psutil

    if child.poll() is not None:
        members = []
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(process.pid) == child.pid:
                    members.append(process)
        if not members:
            return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def wait_until(
    condition: Callable[[], bool], *, timeout: float, every: float = 0.1, what: str
) -> float:
    """Poll `condition` until true; returns the seconds it took. Raises TimeoutError
    naming `what` (a scenario turns that into a violation: the job did not recover)."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - began


ScenarioFn = Callable[[FaultContext], Outcome]


@dataclass(frozen=True)
class Scenario:
    name: str  # "<job>-<fault>", what --only matches
    job: str
    fault: str
    run: ScenarioFn
    full_only: bool = False  # too slow for --quick (CI); run by the full suite


SCENARIOS: list[Scenario] = []


def scenario(
    name: str, *, job: str, fault: str, full_only: bool = False
) -> Callable[[ScenarioFn], ScenarioFn]:
    def register(fn: ScenarioFn) -> ScenarioFn:
        if any(s.name == name for s in SCENARIOS):
            raise ValueError(f"fault scenario {name!r} registered twice")
        SCENARIOS.append(Scenario(name, job, fault, fn, full_only))
        return fn

    return register


@contextlib.contextmanager
def scenario_context(
    *, quick: bool, seed: int, postgres: SuitePostgres, workdir: Path
) -> Iterator[FaultContext]:
    ctx = FaultContext(quick=quick, seed=seed, postgres=postgres, workdir=workdir)
    try:
        yield ctx
    finally:
        ctx.stop_children()
