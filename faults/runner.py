"""Runs the registered scenarios and renders the table of docs/reliability.md."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import shutil
import tempfile
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from faults import scenarios as scenarios_package
from faults.core import SCENARIOS, Outcome, Scenario, Violation, scenario_context
from faults.postgres import SuitePostgres

log = logging.getLogger(__name__)


def load_scenarios() -> list[Scenario]:
    for module in pkgutil.iter_modules(scenarios_package.__path__):
        importlib.import_module(f"{scenarios_package.__name__}.{module.name}")
    return list(SCENARIOS)


def select(
    all_scenarios: Sequence[Scenario], only: Sequence[str], *, quick: bool = False
) -> list[Scenario]:
    """The scenarios to run: those whose name contains one of `only` (all without it);
    --quick leaves out the full-only ones unless named."""
    if not only:
        return [s for s in all_scenarios if not (quick and s.full_only)]
    chosen = [s for s in all_scenarios if any(o in s.name for o in only)]
    if not chosen:
        names = ", ".join(s.name for s in all_scenarios)
        raise ValueError(f"--only {' '.join(only)} matches no scenario; there are: {names}")
    return chosen


def run_scenarios(
    chosen: Sequence[Scenario], *, quick: bool, seed: int, echo=print
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    with SuitePostgres() as postgres:
        for number, item in enumerate(chosen):
            workdir = Path(tempfile.mkdtemp(prefix=f"pin-faults-{item.name}-"))
            began = time.monotonic()
            echo(f"[{number + 1}/{len(chosen)}] {item.name}: {item.fault} ...")
            with scenario_context(
                quick=quick, seed=seed + number, postgres=postgres, workdir=workdir
            ) as ctx:
                try:
                    outcome = item.run(ctx)
                except Exception as exc:  # the scenario itself broke: that is a finding too
                    outcome = Outcome(job=item.job, fault=item.fault)
                    outcome.violations.append(
                        Violation(f"{item.job}.scenario_completed", f"{exc!r}")
                    )
                    log.debug("%s", traceback.format_exc())
            outcome.seconds = time.monotonic() - began
            outcomes.append(outcome)
            verdict = "ok" if not outcome.violations else "INVARIANT BROKEN"
            echo(
                f"    {verdict}: {outcome.operations} operations, "
                f"{outcome.faults_injected} faults, lost {outcome.lost}, "
                f"duplicated {outcome.duplicated}, redelivered {outcome.redeliveries}, "
                f"longest recovery {outcome.longest_recovery_seconds:.1f} s "
                f"({outcome.seconds:.0f} s)"
            )
            for violation in outcome.violations:
                echo(f"    INVARIANT BROKEN {violation}  (logs: {workdir})")
            if not outcome.violations:
                shutil.rmtree(workdir, ignore_errors=True)
    return outcomes


def render_table(outcomes: Sequence[Outcome]) -> str:
    rows = [
        "| job | fault | operations | faults injected | lost | duplicated | redeliveries "
        "| longest recovery | invariants |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        broken = "; ".join(v.invariant for v in o.violations) or "hold"
        rows.append(
            f"| {o.job} | {o.fault} | {o.operations} | {o.faults_injected} | {o.lost} "
            f"| {o.duplicated} | {o.redeliveries} | {o.longest_recovery_seconds:.1f} s "
            f"| {broken} |"
        )
    return "\n".join(rows)


def write_report(path: Path, outcomes: Sequence[Outcome], command: str) -> None:
    """Replace the generated part of docs/reliability.md (between the markers) with the
    table, the command and the date; the prose around it is kept."""
    begin, end = "<!-- faults-table:begin -->", "<!-- faults-table:end -->"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = f"{begin}\nProduced by `{command}` on {stamp}.\n\n{render_table(outcomes)}\n{end}"
    text = path.read_text() if path.exists() else f"# Reliability\n\n{begin}\n{end}\n"
    if begin not in text:
        text = f"{text.rstrip()}\n\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{block}{tail}")
