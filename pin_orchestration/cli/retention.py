"""`pin retention run`: pin-retention from the command line."""

from __future__ import annotations

import json
import sys
import uuid

import click

from pin_orchestration.cancellation import stop_requested_on_signals
from pin_orchestration.db import engine_from_env
from pin_orchestration.jobruns import RunStatus
from pin_orchestration.locks import default_holder
from pin_orchestration.options import click_options
from pin_orchestration.retention import RetentionConfigError, RetentionOptions, run_retention


@click.group()
def retention() -> None:
    """pin-retention: delete rows older than their configured ages."""


@retention.command("run")
@click_options(RetentionOptions)
def retention_run(**fields: object) -> None:
    """Delete what is older than the configured ages now, in batches, under the lock."""
    options = RetentionOptions(**fields)  # type: ignore[arg-type]
    try:
        options.validate()
    except RetentionConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    run_id = f"cli-{uuid.uuid4()}"
    with stop_requested_on_signals() as stop:
        result = run_retention(
            engine_from_env(),
            options,
            run_id=run_id,
            holder=default_holder(run_id),
            stop_requested=stop,
        )
    click.echo(json.dumps(result.summary()))
    if result.status == RunStatus.FAILED:
        sys.exit(1)
    if result.status == RunStatus.CANCELLED:
        sys.exit(130)
