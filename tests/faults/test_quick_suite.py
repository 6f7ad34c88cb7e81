"""`pin faults run --quick`, as CI runs it: every quick scenario of every job, and every
invariant holds. (The full run, which writes docs/reliability.md, is run by hand.)"""

from __future__ import annotations

import pytest

from faults.runner import load_scenarios
from tests.faults.broken_build import run_suite

# What the suite may take on a loaded CI machine; pytest's own limit (pyproject's 300 s,
# meant for one lock wait) sits a minute above it so the suite's timeout reports first.
SUITE_TIMEOUT_SECONDS = 900


@pytest.mark.timeout(SUITE_TIMEOUT_SECONDS + 60)
def test_pin_faults_run_quick_passes_with_every_invariant_holding() -> None:
    result = run_suite(None, timeout=SUITE_TIMEOUT_SECONDS)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    rows = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| job |")
    ]
    quick = [s for s in load_scenarios() if not s.full_only]
    assert len(rows) == len(quick)
    for item in quick:
        assert f"| {item.job} | {item.fault} |" in result.stdout, item.name
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        job, fault, lost, duplicated, invariants = cells[0], cells[1], cells[4], cells[5], cells[8]
        assert (lost, duplicated, invariants) == ("0", "0", "hold"), f"{job}: {fault}: {row}"
