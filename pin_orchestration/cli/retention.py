"""`pin retention run`: pin-retention from the command line."""

from __future__ import annotations

import functools

import click

from pin_orchestration.cli.runs import run_once_and_exit
from pin_orchestration.coordination.retention import (
    RetentionConfigError,
    RetentionOptions,
    run_retention,
)
from pin_orchestration.platform.db import engine_from_env
from pin_orchestration.platform.options import click_options


@click.group()
def retention() -> None:
    """pin-retention: delete rows older than their configured ages."""


@retention.command("run")
@click_options(RetentionOptions)
def retention_run(**fields: object) -> None:
    """Delete what is older than the configured ages now, in batches, under the lock."""
    # Here, not at the top: every area's code, which `pin`'s other commands do not load.
    from pin_orchestration.areas import retention_rules

    options = RetentionOptions(**fields)  # type: ignore[arg-type]
    try:
        options.validate()
    except RetentionConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    run_once_and_exit(
        functools.partial(run_retention, engine_from_env(), options, retention_rules())
    )
