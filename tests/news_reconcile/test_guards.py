"""Broken builds of the reconcile (issue 20, item 7): a guard edited out of a copy of the
package, and the scenario test that guard exists for, run against that copy, fails naming
it. Each scenario passes on the real build (test_reconcile.py, test_guard_scenarios.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.faults.broken_build import broken_copy

RACE_TESTS = Path(__file__).parent / "test_reconcile.py"
GUARD_SCENARIOS = Path(__file__).parent / "test_guard_scenarios.py"


def run_race_test(
    root: Path, name: str, tests: Path = RACE_TESTS
) -> subprocess.CompletedProcess[str]:
    """One test of `tests` (test_reconcile.py by default), importing the broken copy (first
    on the path; the checkout's tests package appended after it)."""
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
            f"{tests}::{name}",
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


def test_without_the_changed_since_snapshot_recheck_a_hot_path_write_is_overwritten(
    tmp_path: Path,
) -> None:
    # The batch locks a drifted post even when a hot-path writer changed the row after the
    # batch's snapshot (PostgreSQL re-reads the newest version for the lock): the update
    # then writes the count taken before that write over it.
    root = broken_copy(
        tmp_path,
        "news/reconcile.sql",
        "                  AND p.xmin = d.row_version AND EXISTS (SELECT FROM fence)\n",
        "                  AND EXISTS (SELECT FROM fence)\n",
    )
    result = run_race_test(
        root,
        "test_a_hot_path_write_after_the_batchs_snapshot_is_not_overwritten",
        GUARD_SCENARIOS,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the batch overwrote a hot-path write committed after its snapshot" in result.stdout
    assert "counter 3, 4 Visible comments" in result.stdout


# The checkpoint moved out of the batch's statement: written and committed on its own just
# before the batch (the batch's own checkpoint write, same value, stays).
CHECKPOINT_FIRST = """    LOOP
        WITH candidates AS MATERIALIZED (
            {candidates}
        ),
        batch AS (
            SELECT count(*) AS candidate_count,
                   (SELECT id FROM candidates ORDER BY id DESC LIMIT 1) AS last_candidate_id
            FROM candidates
        )
        INSERT INTO pin.job_checkpoints AS k
            (checkpoint_key, last_id, window_start, window_end, updated_at)
        SELECT p_checkpoint_key,
               CASE WHEN candidate_count = p_batch_size THEN last_candidate_id
                    ELSE p_end_cursor END,
               p_window_start, p_window_end, now()
        FROM batch
        ON CONFLICT (checkpoint_key) DO UPDATE
            SET last_id = excluded.last_id, window_start = excluded.window_start,
                window_end = excluded.window_end, updated_at = excluded.updated_at;
        COMMIT;
        BEGIN
            WITH fence AS MATERIALIZED (
"""


def test_a_checkpoint_committed_apart_from_its_batch_skips_a_failed_batch(
    tmp_path: Path,
) -> None:
    # A batch that fails rolls back its corrections but not the checkpoint, which already
    # points past it: the resumed run starts after the failed batch and never reconciles it.
    root = broken_copy(
        tmp_path,
        "news/reconcile.sql",
        "    LOOP\n        BEGIN\n            WITH fence AS MATERIALIZED (\n",
        CHECKPOINT_FIRST,
    )
    result = run_race_test(root, "test_a_batch_that_fails_is_resumed_not_skipped", GUARD_SCENARIOS)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the resumed run skipped the failed batch: 2 drifted posts left" in result.stdout
