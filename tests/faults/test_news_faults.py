"""The news scenarios (reconcile, detach) hold in quick mode, and fail naming
`detach.one_call_at_a_time` when the detach claim stops locking the rows it claims.

Only removing SKIP LOCKED (keeping FOR UPDATE) is not observable as a duplicate, by
design: a second claimer then waits for the first's commit and PostgreSQL re-checks
`next_attempt_at <= now` on the row the first claim stamped with its lease, so it skips
it — slower, never twice. Without the row lock both claimers read the same due rows and
both call selections for them at once."""

from __future__ import annotations

from pathlib import Path

from tests.faults.broken_build import broken_copy, run_suite


def test_claim_without_its_row_lock_breaks_one_call_at_a_time(tmp_path: Path) -> None:
    root = broken_copy(
        tmp_path,
        "news/snapshot_detach/queries.sql",
        "LIMIT :batch_size\nFOR UPDATE SKIP LOCKED\n",
        "LIMIT :batch_size\n",
    )
    # Two claimers reading the same due rows is a race the scenario lines up (a start line)
    # but cannot force on a loaded machine: up to three runs, the first that catches it
    # counts. A healthy build never violates the invariant, however often it runs.
    for _ in range(3):
        result = run_suite(root, "detach-parallel-runners")
        if result.returncode == 1 and "detach.one_call_at_a_time" in result.stderr:
            break
    assert result.returncode == 1, result.stdout + result.stderr
    assert "detach.one_call_at_a_time" in result.stderr
