"""`pin faults run --quick`, as CI runs it: every quick scenario of every job, and every
invariant holds. (The full run, which writes docs/reliability.md, is run by hand.)

The scenarios run in three groups, one `pin faults run --quick --only …` each, so the suite
can run them on three workers: one run of all of them is four minutes of mostly waiting for
recoveries, which on one worker was the longest path through the suite."""

from __future__ import annotations

import pytest

from faults.runner import load_scenarios
from tests.faults.broken_build import run_suite

# What the suite may take on a loaded CI machine; pytest's own limit (pyproject's 300 s,
# meant for one lock wait) sits a minute above it so the suite's timeout reports first.
SUITE_TIMEOUT_SECONDS = 900


# Of about equal length: scraping's eight scenarios; the detach outbox's and the locks'; the
# recalc queue's and the reconcile's. Every job is in one (checked below).
GROUPS = {
    "scraping": ("scraping",),
    "detach+locks": ("detach", "locks"),
    "recalc+reconcile": ("recalc", "reconcile"),
}


def test_the_groups_cover_every_quick_scenario_once() -> None:
    quick = [s for s in load_scenarios() if not s.full_only]
    for item in quick:
        groups = [name for name, jobs in GROUPS.items() if item.job in jobs]
        assert len(groups) == 1, f"{item.name}: in groups {groups}"
        # What `--only <job>-` selects.
        assert item.name.startswith(f"{item.job}-"), item.name


@pytest.mark.timeout(SUITE_TIMEOUT_SECONDS + 60)
@pytest.mark.parametrize("group", GROUPS)
def test_pin_faults_run_quick_passes_with_every_invariant_holding(group: str) -> None:
    jobs = GROUPS[group]
    result = run_suite(None, *(f"{job}-" for job in jobs), timeout=SUITE_TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    rows = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| job |")
    ]
    quick = [s for s in load_scenarios() if not s.full_only and s.job in jobs]
    assert len(rows) == len(quick)
    for item in quick:
        assert f"| {item.job} | {item.fault} |" in result.stdout, item.name
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        job, fault, lost, duplicated, invariants = cells[0], cells[1], cells[4], cells[5], cells[8]
        assert (lost, duplicated, invariants) == ("0", "0", "hold"), f"{job}: {fault}: {row}"
