"""Commands meeting an expected condition (no database here, one not migrated, a stack
already running) say which PIN_HOME / database they used and what to run: one line, never a
traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy.engine import make_url

from pin_orchestration.devstack.stack_recovery import record_stack
from tests.test_cli import pin


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_command_in_a_home_without_a_database_creates_none(tmp_path: Path) -> None:
    home = tmp_path / "elsewhere" / ".pin"
    result = pin("locks", "list", url=None, home=home)
    assert_one_line_error(result, f"PIN_HOME={home}", "pin up", "PIN_DATABASE_URL")
    assert not (home / "pgdata").exists(), "a new embedded PostgreSQL was created"


def test_a_command_on_an_unmigrated_database_says_what_to_run(empty_db_url: str) -> None:
    result = pin("locks", "list", url=empty_db_url)
    shown = make_url(empty_db_url).render_as_string(hide_password=True)
    assert_one_line_error(result, shown, "not migrated", "pin db upgrade")


def test_a_second_pin_up_beside_a_live_one_is_one_line(db_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # A live `pin up` of this home, as its pids file records it (its command line names
    # pin): it waits on its stdin, the gate this test closes.
    live = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()  # pin up"],
        stdin=subprocess.PIPE,
    )
    try:
        record_stack(home, pin_up_pid=live.pid, dagster_dev_pid=0)
        result = pin("up", "--no-demo", url=db_url, home=home)
        assert_one_line_error(result, "already running", str(home), str(live.pid))
    finally:
        live.stdin.close()
        live.wait(timeout=30)
