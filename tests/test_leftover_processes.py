"""The session's end check: a process a test leaves running fails the session, named."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from pin_orchestration.devstack.processes import MARKER_VARIABLE, no_survivors, stuck_state

ROOT = Path(__file__).resolve().parents[1]

LEAKING_TEST = """
import subprocess
import sys
from pathlib import Path


def test_leaves_a_process_behind(tmp_path: Path) -> None:
    # A grandchild re-parented to init once its parent exits: not a descendant of the
    # session any more, only its inherited marker tells. (Not in a session of its own: a
    # group leader's number is what a stale os.killpg elsewhere in a parallel suite, its
    # child's PID reused, would hit; this one stays in the suite's process group.)
    subprocess.run(
        [sys.executable, "-c",
         "import subprocess, sys; p = subprocess.Popen(['sleep', '{seconds}']); "
         "print(p.pid)"],
        check=True, stdout=open(Path("{pid_file}"), "w"),
    )
"""


def _session(tmp_path: Path, test_source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(test_source))
    session = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.leftover_processes",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_inner.py"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = session.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        # Say what the inner session and its children wait on before ending them.
        stuck = [stuck_state(session.pid)] + [
            stuck_state(child.pid) for child in psutil.Process(session.pid).children(True)
        ]
        session.kill()
        session.communicate()
        raise AssertionError(f"the inner session did not end: {stuck}") from None
    return subprocess.CompletedProcess(session.args, session.returncode, stdout, stderr)


def test_a_leaked_process_fails_the_session_naming_it_and_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "leaked.pid"
    run = _session(tmp_path, LEAKING_TEST.format(seconds=4321, pid_file=pid_file))
    leaked = int(pid_file.read_text())
    try:
        assert run.returncode == 1, (
            f"leaked pid {leaked} alive now: {psutil.pid_exists(leaked)}\n"
            + run.stdout
            + run.stderr
        )
        assert f"pid {leaked}: sleep 4321" in run.stdout, run.stdout
        assert "1 passed, 1 leaked" in run.stdout, run.stdout
        # The check leaves nothing behind itself.
        assert not psutil.pid_exists(leaked) or psutil.Process(leaked).status() == "zombie"
    finally:
        if psutil.pid_exists(leaked):
            psutil.Process(leaked).kill()


def test_a_session_that_stops_what_it_started_passes(tmp_path: Path) -> None:
    run = _session(
        tmp_path,
        """
        import subprocess


        def test_stops_its_process() -> None:
            child = subprocess.Popen(["sleep", "4321"])
            child.terminate()
            child.wait()
        """,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "leaked" not in run.stdout


def test_a_bench_that_leaves_a_process_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bench's marker replaces the session's while it runs; the session's comes back.
    monkeypatch.setenv(MARKER_VARIABLE, os.environ[MARKER_VARIABLE])
    with (
        pytest.raises(SystemExit, match=r"bench/x\.py left processes running .*sleep 4322"),
        no_survivors("bench/x.py", grace=0.5),
    ):
        leaked = subprocess.Popen(["sleep", "4322"], start_new_session=True)
    leaked.wait(10)  # psutil reaped it already: gone is what counts
    assert not psutil.pid_exists(leaked.pid)
