"""The locks scenarios hold, and fail naming `locks.single_holder` when acquiring stops
checking that the previous holder's TTL expired."""

from __future__ import annotations

from pathlib import Path

from tests.faults.broken_build import broken_copy, run_suite


def test_taking_over_an_unexpired_lock_breaks_single_holder(tmp_path: Path) -> None:
    root = broken_copy(
        tmp_path,
        "coordination/locks.py",
        "        WHERE l.expires_at <= now()\n",
        "        WHERE true\n",
    )
    result = run_suite(root, "locks-sigkill")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "locks.single_holder" in result.stderr


def test_renewal_without_its_client_side_deadline_breaks_single_holder(tmp_path: Path) -> None:
    """A blackholed server answers nothing and resets nothing: a renewal waiting on it
    without a deadline of its own never marks the lease lost, and the hung holder steps
    on beside the one that took the lock over after the TTL."""
    root = broken_copy(
        tmp_path,
        "coordination/locks.py",
        "    worker.join(timeout_seconds * 1.5)\n",
        "    worker.join()\n",
    )
    result = run_suite(root, "locks-pg-hang")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "locks.single_holder" in result.stderr
