"""`pin news …`: news-comment-reconcile from the command line."""

from __future__ import annotations

import json
import sys
import uuid

import click

from pin_orchestration.cancellation import stop_requested_on_signals
from pin_orchestration.db import engine_from_env
from pin_orchestration.locks import default_holder
from pin_orchestration.news.reconcile import (
    ReconcileConfigError,
    ReconcileOptions,
    RunStatus,
    run_reconcile,
)
from pin_orchestration.options import click_options


@click.group()
def news() -> None:
    """The news context's jobs."""


@news.command("reconcile")
@click_options(ReconcileOptions)
def news_reconcile(**fields: object) -> None:
    """Run news-comment-reconcile once, now (on-demand FullSweep: --scope FullSweep)."""
    options = ReconcileOptions(**fields)  # type: ignore[arg-type]
    try:
        options.validate()
    except ReconcileConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    run_id = f"cli-{uuid.uuid4()}"
    with stop_requested_on_signals() as stop:
        result = run_reconcile(
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
