"""What `pin up` settles before it starts, when the previous stack on the same PIN_HOME died
without stopping (SIGKILL, the OOM killer, a host crash).

Dagster's default run launcher cannot tell that a run's worker process is gone, so a run
that was in progress when the stack died stays STARTED in run storage forever. Every drain
sensor sizes its runs by the runs in flight, and the tag limits of dagster.yaml count them
too: two such ghosts stopped every scraping worker run and every recalc drain for good
(found by the fault suite's `platform-pin-up-sigkill`). On this single-machine stack every
run worker is a descendant of `pin up`, so once the previous `pin up` and its tree are gone
no run it left in progress can still be running: those runs are marked failed (the run
failure sensor then counts them) and their jobs' leases and locks bring the work back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

log = logging.getLogger(__name__)

PIDS_FILE = "pin-up.pids"
START_TIME_SLACK_SECONDS = 0.01
# Statuses in which a run needs a live worker of the stack that launched it. QUEUED runs
# are not here: the new daemon's coordinator launches them.
LEFT_BEHIND = [
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


# Every Dagster process of a stack carries this variable, set to the stack's id: the code
# servers and run workers dagster dev starts are re-parented to init once their parent
# exits, and only this finds them then.
STACK_VARIABLE = "PIN_UP_STACK"


class StackAlreadyRunning(RuntimeError):
    pass


def new_stack_id() -> str:
    return uuid.uuid4().hex


def stack_processes(stack_id: str) -> list[psutil.Process]:
    """The live processes (this one aside) whose environment names stack `stack_id`."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if (
                process.environ().get(STACK_VARIABLE) == stack_id
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(process)
    return found


def kill_processes(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL each process and wait for it (a Dagster code server stuck in its shutdown
    ends on nothing else)."""
    processes = list(processes)
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(processes, timeout=10)


def _started(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), or None if it is gone."""
    if not pid:
        return None
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _ours(pids: dict[str, Any], name: str) -> psutil.Process | None:
    """The process recorded as `name` if it is still that process: alive, started when it
    was recorded (PIDs wrap, so the number alone may now be another process — a test's,
    another stack's) and naming pin or dagster. A file of an earlier version has no start
    time; the command line is all there is to go on then."""
    pid = pids.get(name)
    if not pid:
        return None
    try:
        process = psutil.Process(pid)
        command = " ".join(process.cmdline())
        started = process.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if f"{name}_started" in pids:
        recorded = pids[f"{name}_started"]
        # create_time is derived from clock ticks since boot: the same process always
        # gives the same value; a tick (10 ms) of slack covers the float's rounding.
        if recorded is None or abs(started - recorded) > START_TIME_SLACK_SECONDS:
            return None
    return process if ("pin" in command or "dagster" in command) else None


def clear_previous_stack(home: Path) -> bool:
    """Refuse to start beside a live `pin up` on this home; kill what a dead one left
    running (a `dagster dev` in its own session survives its parent's SIGKILL and would
    fight the new stack for its ports and daemons). Returns True when a previous stack
    ended without stopping."""
    path = home / PIDS_FILE
    if not path.exists():
        return False
    try:
        pids = json.loads(path.read_text())
    except ValueError:
        pids = {}
    if _ours(pids, "pin_up") is not None and pids.get("pin_up") != os.getpid():
        raise StackAlreadyRunning(
            f"pin up is already running on {home} (pid {pids['pin_up']}); stop it first, "
            f"or set PIN_HOME to run another stack"
        )
    survivor = _ours(pids, "dagster_dev")
    tree = {} if survivor is None else {survivor.pid: survivor}
    if survivor is not None:
        tree.update({child.pid: child for child in survivor.children(recursive=True)})
    if pids.get("stack"):  # also what outlived dagster dev (a file of an earlier version
        # names no stack: dagster dev's tree is all there is to go on then)
        tree.update({process.pid: process for process in stack_processes(pids["stack"])})
    if tree:
        log.warning(
            "the previous pin up died and left %d Dagster processes running (%s): killing them",
            len(tree),
            "dagster dev among them" if survivor is not None else "dagster dev gone",
        )
        kill_processes(tree.values())
    return True


def record_stack(
    home: Path, *, dagster_dev_pid: int, stack_id: str | None = None, pin_up_pid: int | None = None
) -> None:
    """Write down this stack's processes (pin up: this process unless `pin_up_pid`) with
    their start times, which tell them from later processes given the same PIDs, and the
    id its Dagster processes carry in STACK_VARIABLE."""
    pin_up = os.getpid() if pin_up_pid is None else pin_up_pid
    (home / PIDS_FILE).write_text(
        json.dumps(
            {
                "pin_up": pin_up,
                "pin_up_started": _started(pin_up),
                "dagster_dev": dagster_dev_pid,
                "dagster_dev_started": _started(dagster_dev_pid),
                "stack": stack_id,
            }
        )
    )


def forget_stack(home: Path) -> None:
    """A clean stop: nothing is left behind."""
    with contextlib.suppress(FileNotFoundError):
        (home / PIDS_FILE).unlink()


def fail_runs_left_behind(instance: DagsterInstance) -> list[str]:
    """Mark every run the dead stack left in progress as failed (canceled if it was being
    canceled); returns their run ids."""
    settled = []
    for record in instance.get_run_records(RunsFilter(statuses=LEFT_BEHIND)):
        run = record.dagster_run
        message = (
            "Its run worker died with the previous `pin up` (the stack was killed without "
            "stopping); marked by the next `pin up` at start."
        )
        if run.status == DagsterRunStatus.CANCELING:
            instance.report_run_canceled(run, message)
        else:
            instance.report_run_failed(run, message)
        settled.append(run.run_id)
    if settled:
        log.warning("%d run(s) left in progress by the previous pin up marked failed", len(settled))
    return settled
