"""The news scenarios (reconcile, detach) hold in quick mode, and fail naming
`detach.one_claim_per_attempt` when the detach claim stops checking that a row is still as
it read it.

A drain claims on an autocommit connection: lock_due's FOR UPDATE SKIP LOCKED holds its
rows only for that statement, and mark_claimed stamps a row only while it still carries
what lock_due read (attempts, next_attempt_at). That stamp condition is what keeps two
claimers from claiming one row; without it both stamp the same due rows. The scenario
lines the two runners' first claims up at a gate (both read before either stamps), so
the broken build is caught on every run, not when a race happens to go its way."""

from __future__ import annotations

from pathlib import Path

from tests.faults.broken_build import broken_copy, run_suite


def test_claim_without_its_stamp_check_breaks_one_claim_per_attempt(tmp_path: Path) -> None:
    root = broken_copy(
        tmp_path,
        "news/snapshot_detach/queries.sql",
        "  AND o.attempts = c.attempts - 1 AND o.next_attempt_at = c.previous_next_attempt_at\n",
        "",
    )
    result = run_suite(root, "detach-parallel-runners")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "detach.one_claim_per_attempt" in result.stderr, result.stderr
