"""`pin chessboard …`: runbook actions of project-aggregates-recalc from a shell."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import asdict

import click

from pin_orchestration.chessboard.queue import DRAIN_TICK_OPTIONS, RecalcConfigError, RecalcPolicy
from pin_orchestration.platform.db import engine_from_env
from pin_orchestration.platform.options import click_options
from pin_orchestration.platform.settings import Settings


def _echo(data: object) -> None:
    click.echo(json.dumps(data, default=str, indent=2))


@click.group()
def chessboard() -> None:
    """chessboard project-aggregates-recalc (seed 002)."""


@chessboard.command("status")
def status() -> None:
    """Queue depth, due backlog, poison rows, outbox backlog."""
    from pin_orchestration.chessboard.queue import poison_rows, query, queue_stats

    with engine_from_env().connect() as conn:
        stats = queue_stats(conn)
        outbox = conn.execute(query("outbox_stats")).one()
        poison = poison_rows(conn)
    _echo(
        {
            "queue": asdict(stats),
            "poison_rows": poison,
            "outbox_pending": outbox.pending,
            "outbox_oldest_pending_age_seconds": outbox.oldest_pending_age_seconds,
        }
    )


@chessboard.command("force-recalc")
@click.argument("project_ids", nargs=-1, required=True, type=click.UUID)
@click.option(
    "--now",
    "immediately",
    is_flag=True,
    help="Recalculate here and now instead of queueing a row due now",
)
def force_recalc(project_ids: tuple[uuid.UUID, ...], immediately: bool) -> None:
    """Runbook 'force recalc': queue each project due now (or recalc it at once)."""
    from pin_orchestration.chessboard.drain import force_recalc_project
    from pin_orchestration.chessboard.queue import force_recalc_now

    engine = engine_from_env()
    for project_id in project_ids:
        if immediately:
            _echo(
                {"project_id": project_id, **force_recalc_project(engine, project_id).as_metadata()}
            )
        elif not force_recalc_now(engine, project_id):
            raise click.ClickException(f"no project {project_id}")
        else:
            click.echo(f"{project_id}: recalc queued, due now")


@chessboard.command("reset-poison")
@click.argument("project_id", type=click.UUID)
def reset_poison(project_id: uuid.UUID) -> None:
    """Runbook 'reset a poison row' after fixing its cause: attempts 0, due now."""
    from pin_orchestration.chessboard.queue import reset_poison_row

    if not reset_poison_row(engine_from_env(), project_id):
        raise click.ClickException(f"no queue row for project {project_id}")
    click.echo(f"{project_id}: attempt_count reset, due now")


@chessboard.command("check-divergence")
@click.argument("project_ids", nargs=-1, required=True, type=click.UUID)
def check_divergence(project_ids: tuple[uuid.UUID, ...]) -> None:
    """Runbook 'divergence check': stored aggregates vs the source of truth (exit 1 on
    divergence; fix with force-recalc)."""
    from pin_orchestration.chessboard.recalc import find_divergence

    with engine_from_env().connect() as conn:
        diverged = [asdict(d) for p in project_ids for d in find_divergence(conn, p)]
    _echo(diverged)
    if diverged:
        sys.exit(1)


@chessboard.command("drain")
@click_options(RecalcPolicy, DRAIN_TICK_OPTIONS)
def drain(**options: object) -> None:
    """One drain tick from the command line (what a drain run does per tick)."""
    from pin_orchestration.chessboard.drain import drain_tick
    from pin_orchestration.coordination.cancellation import stop_requested_on_signals

    policy = RecalcPolicy(**options)  # type: ignore[arg-type]
    try:
        policy.validate()
    except RecalcConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    with stop_requested_on_signals() as stop:
        tick = drain_tick(engine_from_env(), policy=policy, should_stop=stop.is_set)
    _echo(
        {
            "recalculated": tick.count("recalculated"),
            "skipped": tick.count("skipped"),
            "failed": tick.count("failed"),
            "poisoned": [str(o.project_id) for o in tick.poisoned],
            "stopped": tick.stopped,
        }
    )


@chessboard.command("publish")
@click.option("--once", is_flag=True, help="Publish what is pending, then exit")
@click.option("--poll-interval-seconds", type=float, default=1.0, show_default=True)
def publish(once: bool, poll_interval_seconds: float) -> None:
    """Run the outbox publisher: Kafka at PIN_KAFKA_BOOTSTRAP_SERVERS, else the local
    JSONL sink under PIN_HOME (it says which at start)."""
    from pin_orchestration.chessboard.outbox.publisher import (
        LOCK_KEY,
        make_sink,
        publish_once,
        run_publisher,
    )
    from pin_orchestration.coordination.cancellation import stop_requested_on_signals
    from pin_orchestration.coordination.locks import LockLost, default_holder

    settings = Settings.from_env()
    engine = engine_from_env()
    sink = make_sink(settings.kafka_bootstrap_servers, settings.home)
    click.echo(f"chessboard outbox publisher → {sink.describe()}")
    if once:
        try:
            result = publish_once(engine, sink, default_holder())
        except LockLost as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            sink.close()
        if result is None:
            raise click.ClickException(f"{LOCK_KEY} is held by a running publisher; not started")
        _echo(asdict(result))
        sys.exit(1 if result.failed else 0)
    with stop_requested_on_signals() as stop:
        run_publisher(
            engine,
            sink,
            stop=stop,
            holder=default_holder(),
            poll_interval_seconds=poll_interval_seconds,
        )
