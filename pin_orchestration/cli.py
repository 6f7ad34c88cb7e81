"""`pin`: the operators' command line (runbook actions, the dev stack, migrations)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from pin_orchestration.cancellation import stop_requested_on_signals
from pin_orchestration.chessboard.cli import chessboard
from pin_orchestration.db import create_db_engine, resolve_database_url
from pin_orchestration.settings import Settings, SettingsError


def _engine():  # type: ignore[no-untyped-def]
    try:
        return create_db_engine(resolve_database_url(Settings.from_env()))
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG")
def main(verbose: bool) -> None:
    """pin-orchestration operator commands."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=3000, show_default=True, help="Dagster UI port")
@click.option("--metrics-port", default=9108, show_default=True)
@click.option("--dagster-yaml", type=click.Path(path_type=Path), default=Path("dagster.yaml"))
@click.option("--workspace", type=click.Path(path_type=Path), default=Path("workspace.yaml"))
@click.option("--no-demo", is_flag=True, help="Do not load demo data")
def up(
    host: str, port: int, metrics_port: int, dagster_yaml: Path, workspace: Path, no_demo: bool
) -> None:
    """Bring the whole system up: database, migrations, demo data, Dagster UI + daemon."""
    from pin_orchestration.devstack import run_stack

    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc
    sys.exit(
        run_stack(
            settings=settings,
            dagster_yaml=dagster_yaml.resolve(),
            workspace_yaml=workspace.resolve(),
            host=host,
            port=port,
            metrics_port=metrics_port,
            seed_demo=not no_demo,
        )
    )


main.add_command(chessboard)


@main.group()
def db() -> None:
    """Schema migrations (alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Create or migrate every schema the project uses."""
    from pin_orchestration.migrations import current_revision, upgrade_database

    url = resolve_database_url(Settings.from_env())
    upgrade_database(url, revision)
    click.echo(f"database at revision {current_revision(create_db_engine(url))}")


@db.command("grant-raiser")
@click.argument("role")
def db_grant_raiser(role: str) -> None:
    """Let ROLE raise recalcs and detaches (EXECUTE on the SQL functions, nothing else)."""
    from pin_orchestration.raisers import RaiserRoleError, grant_raiser

    try:
        for statement in grant_raiser(_engine(), role):
            click.echo(statement)
    except RaiserRoleError as exc:
        raise click.ClickException(str(exc)) from exc


@main.group()
def demo() -> None:
    """Demo data for the embedded default."""


@demo.command("seed")
def demo_seed() -> None:
    """Load demo rows (idempotent)."""
    from pin_orchestration.demo import seed_demo_data

    click.echo(json.dumps(seed_demo_data(_engine())))


@main.group()
def locks() -> None:
    """Distributed locks (pin.distributed_locks)."""


@locks.command("list")
def locks_list() -> None:
    """Who holds which lock, and until when."""
    from pin_orchestration.locks import list_locks

    for lock in list_locks(_engine()):
        state = "EXPIRED" if lock.expired else "held"
        click.echo(
            f"{lock.lock_key}\t{lock.holder}\t{state}\t"
            f"acquired {lock.acquired_at.isoformat()}\texpires {lock.expires_at.isoformat()}"
        )


@locks.command("release")
@click.argument("lock_key")
def locks_release(lock_key: str) -> None:
    """Runbook: drop a stuck lock whoever holds it."""
    from pin_orchestration.locks import force_release_lock

    if not force_release_lock(_engine(), lock_key):
        raise click.ClickException(f"no lock {lock_key!r}")
    click.echo(f"released {lock_key}")


@main.group()
def news() -> None:
    """The news context's jobs."""


@news.command("reconcile")
@click.option("--scope", type=click.Choice(["DailyWindow", "FullSweep"]), default="DailyWindow")
@click.option("--batch-size", type=int, default=500, show_default=True)
@click.option("--max-run-duration-seconds", type=float, default=1200, show_default=True)
@click.option("--window-lookback-hours", type=float, default=26, show_default=True)
@click.option("--lock-ttl-seconds", type=float, default=1800, show_default=True)
@click.option("--drift-alert-threshold", type=int, default=100, show_default=True)
def news_reconcile(
    scope: str,
    batch_size: int,
    max_run_duration_seconds: float,
    window_lookback_hours: float,
    lock_ttl_seconds: float,
    drift_alert_threshold: int,
) -> None:
    """Run news-comment-reconcile once, now (on-demand FullSweep: --scope FullSweep)."""
    import uuid

    from pin_orchestration.locks import default_holder
    from pin_orchestration.news.reconcile import (
        ReconcileConfigError,
        ReconcileOptions,
        RunStatus,
        run_reconcile,
    )

    options = ReconcileOptions(
        scope=scope,  # type: ignore[arg-type]
        batch_size=batch_size,
        max_run_duration_seconds=max_run_duration_seconds,
        window_lookback_hours=window_lookback_hours,
        lock_ttl_seconds=lock_ttl_seconds,
        drift_alert_threshold=drift_alert_threshold,
    )
    try:
        options.validate()
    except ReconcileConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    run_id = f"cli-{uuid.uuid4()}"
    with stop_requested_on_signals() as stop:
        result = run_reconcile(
            _engine(), options, run_id=run_id, holder=default_holder(run_id), stop_requested=stop
        )
    click.echo(json.dumps(result.summary()))
    if result.status == RunStatus.FAILED:
        sys.exit(1)
    if result.status == RunStatus.CANCELLED:
        sys.exit(130)


@main.group()
def metrics() -> None:
    """Prometheus metrics."""


@metrics.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9108, show_default=True)
def metrics_serve(host: str, port: int) -> None:
    """Serve /metrics until interrupted."""
    import threading

    from pin_orchestration.metrics import serve_metrics

    server = serve_metrics(_engine(), host, port)
    click.echo(f"serving http://{host}:{port}/metrics")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


from pin_orchestration.news.snapshot_detach_cli import detach  # noqa: E402

main.add_command(detach)

if __name__ == "__main__":
    main()
