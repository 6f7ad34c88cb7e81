"""`pin detach …`: news-snapshot-detach-retry from the command line (runbook, DET-7)."""

from __future__ import annotations

import functools
import json
import uuid

import click

from pin_orchestration.cli.runs import run_once_and_exit
from pin_orchestration.news.selections import selections_client
from pin_orchestration.news.snapshot_detach.monitoring import outbox_state, quarantined_entries
from pin_orchestration.news.snapshot_detach.outbox import RequeueError, requeue_quarantined
from pin_orchestration.news.snapshot_detach.policy import (
    DetachOptions,
    SnapshotDetachConfigError,
)
from pin_orchestration.news.snapshot_detach.worker import run_detach_retry
from pin_orchestration.platform.db import engine_from_env
from pin_orchestration.platform.options import click_options


@click.group()
def detach() -> None:
    """news-snapshot-detach-retry: the outbox of selection-snapshot detaches."""


@detach.command("run")
@click_options(DetachOptions)
@click.option("--detach-call-timeout-seconds", type=float, default=5.0, show_default=True)
def detach_run(detach_call_timeout_seconds: float, **fields: object) -> None:
    """Drain the due rows once, now, under the job's lock (PIN_SELECTIONS_URL / _TOKEN)."""
    options = DetachOptions(**fields)  # type: ignore[arg-type]
    try:
        options.validate()
        client = selections_client(
            None,
            None,
            timeout_seconds=detach_call_timeout_seconds,
            pool_size=options.max_concurrency,
        )
    except (SnapshotDetachConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    with client:
        run_once_and_exit(functools.partial(run_detach_retry, engine_from_env(), client, options))


@detach.command("requeue")
@click.argument("entry_id", type=click.UUID, required=False)
@click.option("--snapshot-id", type=click.UUID, help="Re-enqueue by snapshot id instead")
def detach_requeue(entry_id: uuid.UUID | None, snapshot_id: uuid.UUID | None) -> None:
    """Runbook: a Quarantined entry → Pending, attempts 0, due now."""
    try:
        requeued = requeue_quarantined(
            engine_from_env(), entry_id=entry_id, snapshot_id=snapshot_id
        )
    except RequeueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"re-enqueued {requeued}")


@detach.command("status")
@click.option("--limit", type=int, default=20, show_default=True)
def detach_status(limit: int) -> None:
    """Pending / Quarantined counts and the latest Quarantined entries with their error."""
    engine = engine_from_env()
    state = outbox_state(engine)
    click.echo(
        json.dumps(
            {
                "pending": state.pending,
                "quarantined": state.quarantined,
                "oldest_age_seconds": round(state.oldest_age_seconds, 1),
                "quarantined_entries": quarantined_entries(engine, limit),
            },
            default=str,
            indent=2,
        )
    )
