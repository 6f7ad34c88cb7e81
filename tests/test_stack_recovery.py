"""pin up after a stack that died without stopping: its survivors are killed, a live stack
is not started beside, and the runs it left in progress are settled (else every drain
sensor counts them as in flight forever)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from pin_orchestration.devstack.stack_recovery import (
    PIDS_FILE,
    STACK_VARIABLE,
    StackAlreadyRunning,
    clear_previous_stack,
    fail_runs_left_behind,
    forget_stack,
    new_stack_id,
    record_stack,
)


def _sleeper(tag: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # "dagster" in its command line: what a survivor of a dead stack looks like. Returned
    # once it has printed, i.e. exec'd: until then its command line is still pytest's
    # (the legacy-file test once read that and did not take the sleeper for the stack).
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; print(flush=True); time.sleep(60)", tag],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None
    process.stdout.readline()
    process.stdout.close()  # it writes nothing more
    return process


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_clean_stop_leaves_nothing_to_clear(tmp_path: Path) -> None:
    record_stack(tmp_path, dagster_dev_pid=_dead_pid())
    forget_stack(tmp_path)
    assert clear_previous_stack(tmp_path) is False


def test_survivors_of_a_dead_stack_are_killed(tmp_path: Path) -> None:
    survivor = _sleeper("dagster-dev-survivor")
    try:
        record_stack(tmp_path, pin_up_pid=_dead_pid(), dagster_dev_pid=survivor.pid)
        assert clear_previous_stack(tmp_path) is True
        survivor.wait(timeout=10)  # psutil reaped it already: gone is what counts
        assert not psutil.pid_exists(survivor.pid)
    finally:
        survivor.kill()


def test_code_servers_that_outlived_dagster_dev_are_killed(tmp_path: Path) -> None:
    """dagster dev died too: its code servers, re-parented to init, are no one's children
    any more; the stack id in their environment still names them."""
    stack_id = new_stack_id()
    orphan = _sleeper("code-server", env={**os.environ, STACK_VARIABLE: stack_id})
    stranger = _sleeper("code-server", env={**os.environ, STACK_VARIABLE: new_stack_id()})
    try:
        record_stack(
            tmp_path, pin_up_pid=_dead_pid(), dagster_dev_pid=_dead_pid(), stack_id=stack_id
        )
        assert clear_previous_stack(tmp_path) is True
        orphan.wait(timeout=10)
        assert not psutil.pid_exists(orphan.pid)
        assert stranger.poll() is None, "another stack's process was killed"
    finally:
        orphan.kill()
        stranger.kill()


def test_a_live_stack_is_not_started_beside(tmp_path: Path) -> None:
    live = _sleeper("pin-up-live")
    try:
        record_stack(tmp_path, pin_up_pid=live.pid, dagster_dev_pid=_dead_pid())
        with pytest.raises(StackAlreadyRunning, match="already running"):
            clear_previous_stack(tmp_path)
        assert live.poll() is None
    finally:
        live.kill()


def test_a_recycled_pid_is_neither_refused_nor_killed(tmp_path: Path) -> None:
    """PIDs wrap (32,768 on this machine's kernel): the numbers a dead stack recorded may
    now be another process whose command line also names pin or dagster — a test's, or
    another stack's. Only the process that was recorded (its start time) is the stack's."""
    stranger = _sleeper("pin-up-stranger")
    try:
        started = psutil.Process(stranger.pid).create_time()
        (tmp_path / PIDS_FILE).write_text(
            json.dumps(
                {
                    "pin_up": stranger.pid,
                    "pin_up_started": started - 100,
                    "dagster_dev": stranger.pid,
                    "dagster_dev_started": started - 100,
                }
            )
        )
        assert clear_previous_stack(tmp_path) is True
        assert stranger.poll() is None, "the process now holding a recorded PID was killed"
    finally:
        stranger.kill()


def test_a_pids_file_of_an_earlier_version_is_still_read(tmp_path: Path) -> None:
    """A pids file without start times (written before they were recorded): a live
    process at the pin_up PID whose command line names pin is taken as the stack."""
    live = _sleeper("pin-up-live")
    try:
        (tmp_path / PIDS_FILE).write_text(json.dumps({"pin_up": live.pid, "dagster_dev": 0}))
        with pytest.raises(StackAlreadyRunning, match="already running"):
            clear_previous_stack(tmp_path)
    finally:
        live.kill()


def test_runs_left_in_progress_are_settled_and_finished_ones_kept() -> None:
    with DagsterInstance.ephemeral() as instance:
        runs = {}
        for status in (
            DagsterRunStatus.STARTED,
            DagsterRunStatus.STARTING,
            DagsterRunStatus.CANCELING,
            DagsterRunStatus.NOT_STARTED,
            DagsterRunStatus.SUCCESS,
        ):
            run = DagsterRun(job_name="scraping_worker", run_id=str(uuid.uuid4()), status=status)
            instance.add_run(run)
            runs[status] = run.run_id
        settled = fail_runs_left_behind(instance)
        assert sorted(settled) == sorted(
            runs[s]
            for s in (
                DagsterRunStatus.STARTED,
                DagsterRunStatus.STARTING,
                DagsterRunStatus.CANCELING,
                DagsterRunStatus.NOT_STARTED,
            )
        )
        status_of = {s: instance.get_run_by_id(i).status for s, i in runs.items()}
        assert status_of[DagsterRunStatus.STARTED] == DagsterRunStatus.FAILURE
        assert status_of[DagsterRunStatus.STARTING] == DagsterRunStatus.FAILURE
        assert status_of[DagsterRunStatus.CANCELING] == DagsterRunStatus.CANCELED
        assert status_of[DagsterRunStatus.NOT_STARTED] == DagsterRunStatus.FAILURE
        assert status_of[DagsterRunStatus.SUCCESS] == DagsterRunStatus.SUCCESS
