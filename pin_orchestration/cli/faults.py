"""`pin faults`: the fault-injection suite (docs/reliability.md).

The suite is not part of the package: it lives in `faults/` at the root of the source
checkout, beside `bench/`, and is imported only when a `pin faults` command runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

import pin_orchestration

# The source checkout this package runs from (an installed wheel has no faults/ beside it).
CHECKOUT = Path(pin_orchestration.__file__).resolve().parent.parent

NO_SUITE = (
    "The fault suite ships with the source checkout, not with the package: clone the "
    "repository and run `pin faults run` from it (no faults/ in {checkout})."
)


def _use_suite() -> None:
    """Make `faults` importable from the checkout, here and in the suite's children (they
    run `python -m faults.scenarios.…`); exit with one line saying how to get it when this
    package runs from no checkout."""
    if not (CHECKOUT / "faults" / "__init__.py").is_file():
        raise click.ClickException(NO_SUITE.format(checkout=CHECKOUT))
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [path, str(CHECKOUT)]))


@click.group()
def faults() -> None:
    """Fault injection: each job under kills, restarts, remote outages and clock jumps."""


@faults.command("list")
def list_scenarios() -> None:
    """The scenarios, one a line: name, job, fault."""
    _use_suite()
    from faults.runner import load_scenarios

    for item in load_scenarios():
        mode = "full only" if item.full_only else "quick and full"
        click.echo(f"{item.name}\t{item.job}\t{item.fault}\t{mode}")


@faults.command("run")
@click.option("--quick", is_flag=True, help="Fewer operations and faults (what CI runs).")
@click.option("--only", multiple=True, help="Run the scenarios whose name contains this.")
@click.option("--seed", type=int, default=20261201, show_default=True, help="Random seed.")
@click.option(
    "--write",
    "write_to",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the table into this file (docs/reliability.md) between its markers.",
)
def run(quick: bool, only: tuple[str, ...], seed: int, write_to: Path | None) -> None:
    """Run the suite; exits 1 naming every broken invariant."""
    import logging

    # Each scenario's database is migrated from a template once; the steps are noise here.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    _use_suite()
    from faults.runner import (
        load_scenarios,
        render_table,
        run_scenarios,
        select,
        write_report,
    )

    try:
        chosen = select(load_scenarios(), only, quick=quick)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from exc
    outcomes = run_scenarios(chosen, quick=quick, seed=seed, echo=click.echo)
    click.echo("")
    click.echo(render_table(outcomes))
    if write_to is not None:
        command = "pin faults run" + (" --quick" if quick else "") + f" --seed {seed}"
        write_report(write_to, outcomes, command)
        click.echo(f"\nwrote the table into {write_to}")
    broken = [v for o in outcomes for v in o.violations]
    if broken:
        click.echo(f"\n{len(broken)} invariant(s) broken:", err=True)
        for violation in broken:
            click.echo(f"  {violation}", err=True)
        sys.exit(1)
