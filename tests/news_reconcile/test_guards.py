"""Broken builds of the reconcile (issue 20, item 7): a guard edited out of a copy of the
package, and the reconcile's own race test, run against that copy, fails naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.faults.broken_build import broken_copy

RACE_TESTS = Path(__file__).parent / "test_reconcile.py"


def run_race_test(root: Path, name: str) -> subprocess.CompletedProcess[str]:
    """One test of test_reconcile.py, importing the broken copy (first on the path; the
    checkout's tests package appended after it)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--import-mode=append",
            f"{RACE_TESTS}::{name}",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_the_drifted_post_lock_the_race_test_names_the_wait(tmp_path: Path) -> None:
    root = broken_copy(
        tmp_path, "news/reconcile.sql", "                FOR NO KEY UPDATE OF p SKIP LOCKED\n", ""
    )
    result = run_race_test(root, "test_post_locked_by_live_writer_is_skipped_not_waited_on")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the run waited on the live row" in result.stdout
    assert "lock timeout" in result.stdout
