"""No process a test session or a bench starts may outlive it: what marks a session's
processes, finds the ones left and stops them (tests/leftover_processes.py is the pytest
plugin built on it; the benches wrap their runs in `no_survivors`).

The session marks its own environment with a fresh PIN_TEST_SESSION; every process it
starts inherits the marker, including one that started its own session and was re-parented
to init when its parent died (a `dagster api grpc` left by a daemon). At the end, a process
that is a descendant of this one or carries the marker is a survivor.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil

MARKER_VARIABLE = "PIN_TEST_SESSION"
# What a clean stop may still take once the session is over (a server finishing its
# shutdown after SIGTERM), before what is left counts as a survivor.
GRACE_SECONDS = 10.0


def mark_session() -> str:
    """Put a new marker in this process's environment (children inherit it); returns it."""
    marker = uuid.uuid4().hex
    os.environ[MARKER_VARIABLE] = marker
    return marker


def _is_interpreter_helper(process: psutil.Process) -> bool:
    # multiprocessing's resource tracker lives as long as this interpreter and ends when it
    # exits (its pipe closes): it cannot outlive the session.
    return any("multiprocessing.resource_tracker" in part for part in process.cmdline())


def survivors(marker: str) -> list[psutil.Process]:
    """Live processes, other than this one, that descend from it or carry `marker`."""
    me = psutil.Process()
    found = {child.pid: child for child in me.children(recursive=True)}
    for process in psutil.process_iter():
        if process.pid == me.pid or process.pid in found:
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get(MARKER_VARIABLE) == marker:
                found[process.pid] = process
    alive = []
    for process in found.values():
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE and not _is_interpreter_helper(process):
                alive.append(process)
    return alive


def describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline())}"
    except psutil.Error:
        return f"pid {process.pid}: (ended while being described)"


def stuck_state(pid: int) -> str:
    """What a process that will not end is doing: its state, signal masks and each
    thread's kernel wait channel (for a test's failure message)."""
    base = Path(f"/proc/{pid}")
    try:
        status = [
            line
            for line in (base / "status").read_text().splitlines()
            if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "Threads"))
        ]
        waits = sorted({(task / "wchan").read_text() for task in (base / "task").iterdir()})
    except OSError as exc:
        return f"pid {pid}: {exc}"
    return f"pid {pid}: {'; '.join(status)}; threads wait in {waits}"


def end_survivors(marker: str, grace: float = GRACE_SECONDS) -> list[str]:
    """Wait up to `grace` for the marked processes to end, SIGKILL those that do not (so
    the check itself leaves nothing behind) and return their descriptions."""
    _, alive = psutil.wait_procs(survivors(marker), timeout=grace)
    named = [describe(process) for process in alive]
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=10)
    return named


def stop_process_tree(root_pid: int, grace: float = 30.0) -> None:
    """SIGTERM `root_pid`, give it `grace` to stop what it started, then SIGKILL whatever
    of its tree is left (a daemon's code server ignores SIGTERM and outlives its parent)."""
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        root.terminate()
    psutil.wait_procs([root], timeout=grace)
    # Anything the tree started while it was stopping belongs to it too.
    for process in list(tree):
        with contextlib.suppress(psutil.NoSuchProcess):
            tree.extend(process.children(recursive=True))
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(tree, timeout=10)


@contextlib.contextmanager
def no_survivors(what: str, grace: float = GRACE_SECONDS) -> Iterator[None]:
    """A bench's run: fail naming any process it started that is still alive at its end."""
    marker = mark_session()
    try:
        yield
    finally:
        left = end_survivors(marker, grace)
        if left:
            raise SystemExit(f"{what} left processes running (killed now): " + "; ".join(left))
