"""`pin up | db | demo | locks | metrics`: the platform's own commands (dev stack,
migrations, demo data, distributed locks, the metrics endpoint)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from pin_orchestration.cli.logs import LOG_LEVELS, configure_logging
from pin_orchestration.platform.db import create_db_engine, engine_from_env, resolve_database_url
from pin_orchestration.platform.defaults import (
    API_PORT,
    DAGSTER_UI_PORT,
    DAGSTER_YAML,
    LOOPBACK,
    METRICS_PORT,
    WORKSPACE_YAML,
)
from pin_orchestration.platform.settings import Settings


@click.command()
@click.option("--host", default=LOOPBACK, show_default=True)
@click.option("--port", default=DAGSTER_UI_PORT, show_default=True, help="Dagster UI port")
@click.option("--metrics-port", default=METRICS_PORT, show_default=True)
@click.option("--api-port", default=API_PORT, show_default=True, help="Scraping API port")
@click.option("--dagster-yaml", type=click.Path(path_type=Path), default=DAGSTER_YAML)
@click.option("--workspace", type=click.Path(path_type=Path), default=WORKSPACE_YAML)
@click.option("--no-demo", is_flag=True, help="Do not load demo data")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="As `pin --log-level` (./scripts/run --log-level debug): debug shows the Dagster "
    "daemon's sensor ticks and the runs' events",
)
@click.pass_context
def up(
    ctx: click.Context,
    host: str,
    port: int,
    metrics_port: int,
    api_port: int,
    dagster_yaml: Path,
    workspace: Path,
    no_demo: bool,
    log_level: str | None,
) -> None:
    """Bring the whole system up: database, migrations, demo data, Dagster UI + daemon."""
    from pin_orchestration.devstack.stack_recovery import StackAlreadyRunning
    from pin_orchestration.devstack.up import run_stack

    settings = Settings.from_env()
    try:
        code = run_stack(
            settings=settings,
            dagster_yaml=dagster_yaml.resolve(),
            workspace_yaml=workspace.resolve(),
            host=host,
            port=port,
            metrics_port=metrics_port,
            api_port=api_port,
            seed_demo=not no_demo,
            log_level=_stack_log_level(ctx, log_level),
        )
    except StackAlreadyRunning as exc:
        raise click.ClickException(str(exc)) from exc
    sys.exit(code)


def _stack_log_level(ctx: click.Context, log_level: str | None) -> str:
    if log_level is None:
        return (ctx.obj or {}).get("log_level", "info")
    configure_logging(log_level.lower())  # given after `up`: pin's own loggers follow it
    return log_level.lower()


@click.group()
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


@db.command("dump-schema")
def db_dump_schema() -> None:
    """Print the schema at head (`pin db dump-schema > schema.sql`): a scratch database on
    the configured server, migrated to head, dumped with pg_dump --schema-only, dropped."""
    from pin_orchestration.migrations.schema_dump import schema_at_head

    click.echo(schema_at_head(resolve_database_url(Settings.from_env())), nl=False)


@db.command("grant-raiser")
@click.argument("role")
def db_grant_raiser(role: str) -> None:
    """Let ROLE raise recalcs and detaches (EXECUTE on the SQL functions, nothing else)."""
    from pin_orchestration.coordination.raisers import RaiserRoleError, grant_raiser

    try:
        for statement in grant_raiser(engine_from_env(), role):
            click.echo(statement)
    except RaiserRoleError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def demo() -> None:
    """Demo data for the embedded default."""


@demo.command("seed")
def demo_seed() -> None:
    """Load demo rows (idempotent)."""
    from pin_orchestration.devstack.demo import seed_demo_data

    click.echo(json.dumps(seed_demo_data(engine_from_env())))


@click.group()
def locks() -> None:
    """Distributed locks (pin.distributed_locks)."""


@locks.command("list")
def locks_list() -> None:
    """Who holds which lock, and until when."""
    from pin_orchestration.coordination.locks import list_locks

    for lock in list_locks(engine_from_env()):
        state = "EXPIRED" if lock.expired else "held"
        click.echo(
            f"{lock.lock_key}\t{lock.holder}\t{state}\t"
            f"acquired {lock.acquired_at.isoformat()}\texpires {lock.expires_at.isoformat()}"
        )


@locks.command("release")
@click.argument("lock_key")
def locks_release(lock_key: str) -> None:
    """Runbook: drop a stuck lock whoever holds it. LOCK_KEY is the full key or the job
    code (news-comment-reconcile → Pin:lock:job:scheduled:news-comment-reconcile)."""
    from pin_orchestration.coordination.locks import force_release_lock

    released = force_release_lock(engine_from_env(), lock_key)
    if released is None:
        raise click.ClickException(f"no lock {lock_key!r} (`pin locks list` shows the held ones)")
    click.echo(f"released {released}")


@click.group()
def metrics() -> None:
    """Prometheus metrics."""


@metrics.command("serve")
@click.option("--host", default=LOOPBACK, show_default=True)
@click.option("--port", default=METRICS_PORT, show_default=True)
def metrics_serve(host: str, port: int) -> None:
    """Serve /metrics until interrupted."""
    import threading

    from pin_orchestration.areas import metric_collectors
    from pin_orchestration.platform.metrics import serve_metrics

    server = serve_metrics(metric_collectors(engine_from_env()), host, port)
    click.echo(f"serving http://{host}:{port}/metrics")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
