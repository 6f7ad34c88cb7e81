"""`pin news …`: news-comment-reconcile from the command line."""

from __future__ import annotations

import functools

import click

from pin_orchestration.cli.runs import run_once_and_exit
from pin_orchestration.news.reconcile import (
    ReconcileConfigError,
    ReconcileOptions,
    run_reconcile,
)
from pin_orchestration.platform.db import engine_from_env
from pin_orchestration.platform.options import click_options


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
    run_once_and_exit(functools.partial(run_reconcile, engine_from_env(), options))
