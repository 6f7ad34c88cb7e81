"""`pin up`: the whole system on one machine — database, migrations, demo data, local
stand-ins for external services, the metrics endpoint, and Dagster (webserver + daemon).

Every external part is switched to a real one by environment variables, never by code:
PIN_DATABASE_URL (else the embedded PostgreSQL under PIN_HOME), PIN_SELECTIONS_URL (else
the selections stand-in on 127.0.0.1:8790), PIN_KAFKA_BOOTSTRAP_SERVERS (else chessboard
events go to $PIN_HOME/chessboard-events.jsonl).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from dagster import DagsterInstance
from sqlalchemy import Engine

from pin_orchestration.devstack.demo import (
    DEMO_QUARANTINE_NOTE,
    demo_quarantined_ids,
    seed_demo_data,
)
from pin_orchestration.devstack.stack_recovery import (
    clear_previous_stack,
    fail_runs_left_behind,
    forget_stack,
    record_stack,
)
from pin_orchestration.migrations import upgrade_database
from pin_orchestration.platform.dagster_warnings import pythonwarnings_value
from pin_orchestration.platform.db import (
    create_db_engine,
    dagster_storage_url,
    resolve_database_url,
)
from pin_orchestration.platform.metrics import serve_metrics
from pin_orchestration.platform.settings import Settings
from pin_orchestration.sensors.run_failures import RUN_STATUS_SENSOR_PROCESS_LIMIT

log = logging.getLogger(__name__)

# What stops `pin up` when sent to its PID alone (kill PID, systemd, docker stop, Ctrl-C).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def prepare_dagster_home(
    settings: Settings, dagster_yaml: Path, *, run_log_level: str = "DEBUG"
) -> Path:
    """DAGSTER_HOME under the PIN home, holding the repository's dagster.yaml (with the
    level at which runs print Dagster's own events to the console)."""
    if not dagster_yaml.is_file():
        raise FileNotFoundError(
            f"{dagster_yaml} not found: run `pin up` from the repository root or pass "
            "--dagster-yaml PATH"
        )
    home = settings.home / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    text = dagster_yaml.read_text()
    if "python_logs:" not in text:
        # The runs' system loggers (run and step events) print at this level; the event log,
        # hence the UI, keeps every event.
        text += f"\npython_logs:\n  python_log_level: {run_log_level}\n"
    (home / "dagster.yaml").write_text(text)
    return home


def start_local_services(
    settings: Settings, env: dict[str, str], *, seed_demo: bool = True
) -> list[Callable[[], None]]:
    """Start what stands in for external services; returns how to stop each.

    An area whose external service is unset adds its stand-in here and exports its URL
    into `env`, so the Dagster processes started afterwards use it.
    """
    from pin_orchestration.cli.chessboard import start_publisher_process

    stoppers: list[Callable[[], None]] = []
    if settings.selections_url is None:
        from pin_orchestration.devstack.standins.selections import DEFAULT_PORT, SelectionsStandIn

        try:
            stand_in = SelectionsStandIn(port=DEFAULT_PORT, token=settings.selections_token)
        except OSError:  # the port is taken (another stack): any free port serves, the
            # Dagster processes get its URL through PIN_SELECTIONS_URL
            stand_in = SelectionsStandIn(token=settings.selections_token)
        stand_in.start()
        env["PIN_SELECTIONS_URL"] = stand_in.url
        stoppers.append(stand_in.stop)
        log.info(
            'selections stand-in on %s (tell it to fail: POST %s/admin/fail {"status": 503})',
            stand_in.url,
            stand_in.url,
        )
    stoppers.extend(start_scraping_services(settings, env, seed_demo=seed_demo))
    # The chessboard outbox publisher: to Kafka when PIN_KAFKA_BOOTSTRAP_SERVERS is set,
    # else to $PIN_HOME/chessboard-events.jsonl (it logs which at start). Started after the
    # stand-ins so it inherits their URLs.
    stoppers.append(start_publisher_process(env))
    return stoppers


def start_scraping_services(
    settings: Settings, env: dict[str, str], *, seed_demo: bool
) -> list[Callable[[], None]]:
    """The scraping API (`pin api`); with the demo, the demo target site, the demo tenant
    (its key is printed) and a few jobs."""
    from pin_orchestration.devstack.demo import ensure_demo_tenant, submit_demo_jobs
    from pin_orchestration.devstack.standins.scraping_target import DEFAULT_PORT, ScrapingTarget

    api_host, api_port = env["PIN_API_HOST"], env["PIN_API_PORT"]
    env.setdefault("PIN_API_PUBLIC_URL", f"http://{api_host}:{api_port}")
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pin_orchestration.cli",
            "api",
            "--host",
            api_host,
            "--port",
            api_port,
        ],
        env=env,
    )
    api_url = env["PIN_API_PUBLIC_URL"]

    def stop_api() -> None:
        api.terminate()
        try:
            api.wait(timeout=10)
        except subprocess.TimeoutExpired:
            api.kill()

    log.info("scraping API on %s (OpenAPI docs %s/docs)", api_url, api_url)
    if not seed_demo:
        return [stop_api]
    try:
        site = ScrapingTarget(port=DEFAULT_PORT).start()
    except OSError:  # the port is taken (another stack): any free port will do for the demo
        site = ScrapingTarget().start()
    engine = create_db_engine(env["PIN_DATABASE_URL"])
    tenant, key = ensure_demo_tenant(engine, settings.home)
    submit_demo_jobs(engine, tenant.id, site.url)
    log.info(
        "demo tenant %r, API key: %s\n  try: curl -s -XPOST %s/jobs -H 'Authorization: Bearer %s' "
        "-H 'Content-Type: application/json' -d '{\"url\": \"%s/page/hello\"}'",
        tenant.name,
        key,
        api_url,
        key,
        site.url,
    )
    return [site.stop, stop_api]


def log_demo_failures(engine: Engine) -> None:
    """Say which red checks the demo makes on purpose, and what clears them."""
    demo_ids = demo_quarantined_ids(engine)
    if demo_ids:
        commands = "; ".join(f"pin detach requeue {entry}" for entry in demo_ids)
        log.info(
            "%d detach entries, no_quarantined_entries fails — %s: %s",
            len(demo_ids),
            DEMO_QUARANTINE_NOTE,
            commands,
        )


def _dagster_instance(env: dict[str, str]) -> DagsterInstance:
    """The instance dagster dev is about to serve (its dagster.yaml reads the storage URL
    from the environment)."""
    os.environ["PIN_DAGSTER_PG_URL"] = env["PIN_DAGSTER_PG_URL"]
    return DagsterInstance.from_config(env["DAGSTER_HOME"])


def run_stack(
    *,
    settings: Settings,
    dagster_yaml: Path,
    workspace_yaml: Path,
    host: str,
    port: int,
    metrics_port: int,
    api_port: int = 8000,
    seed_demo: bool = True,
    log_level: str = "info",
) -> int:
    # First: beside a live stack nothing else may start (StackAlreadyRunning).
    previous_stack_died = clear_previous_stack(settings.home)
    database_url = resolve_database_url(settings)
    if settings.database_url is None:
        log.info("embedded PostgreSQL running, data in %s", settings.home / "pgdata")
    upgrade_database(database_url)
    engine = create_db_engine(database_url)
    if seed_demo:
        log.info("demo data: %s", seed_demo_data(engine))
        log_demo_failures(engine)

    # An idle stack stays quiet: Dagster's daemon logs every sensor tick at INFO and a run
    # prints its DEBUG events; the UI keeps them all. `pin --log-level debug up` shows them.
    dagster_level = "debug" if log_level == "debug" else "warning"
    env = dict(os.environ)
    env.update(
        {
            "PIN_DATABASE_URL": database_url,
            "PIN_DAGSTER_PG_URL": settings.dagster_pg_url or dagster_storage_url(database_url),
            "PIN_HOME": str(settings.home),
            "DAGSTER_HOME": str(
                prepare_dagster_home(settings, dagster_yaml, run_log_level=dagster_level.upper())
            ),
            "PIN_API_HOST": host,
            "PIN_API_PORT": str(api_port),
        }
    )
    env["PYTHONWARNINGS"] = pythonwarnings_value()
    env["PIN_RUN_LOG_LEVEL"] = dagster_level.upper()
    # The daemon reads this: how many failed runs record_failed_runs takes per tick.
    env.setdefault("DAGSTER_RUN_STATUS_SENSOR_PROCESS_LIMIT", str(RUN_STATUS_SENSOR_PROCESS_LIMIT))
    if previous_stack_died:
        fail_runs_left_behind(_dagster_instance(env))
    stoppers = start_local_services(settings, env, seed_demo=seed_demo)
    metrics_server = serve_metrics(engine, host, metrics_port)
    log.info("metrics on http://%s:%d/metrics", host, metrics_port)
    dagster_home = Path(env["DAGSTER_HOME"])
    dagster = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(workspace_yaml),
        "-h",
        host,
        "-p",
        str(port),
        "--log-level",
        dagster_level,
        "--code-server-log-level",
        dagster_level,
    ]
    log.info("Dagster UI on http://%s:%d", host, port)
    # Its own session: a terminal's Ctrl-C reaches only `pin up`, which then tells dagster
    # dev exactly once, the same way as for a signal sent to `pin up`'s PID alone.
    # cwd is DAGSTER_HOME so dagster dev does not warn that the repository's dagster.yaml
    # (the source of the copy there) is ignored. A process started in the background
    # inherits an ignored SIGINT: give it the default back so it can be stopped.
    dagster_dev = subprocess.Popen(
        dagster,
        env=env,
        cwd=dagster_home,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def stop_dagster(_signo: int, _frame: FrameType | None) -> None:
        # SIGINT is how dagster dev stops its webserver, daemon and code servers cleanly.
        dagster_dev.send_signal(signal.SIGINT)

    previous = {signo: signal.signal(signo, stop_dagster) for signo in STOP_SIGNALS}
    record_stack(settings.home, dagster_dev_pid=dagster_dev.pid)
    try:
        return dagster_dev.wait()
    finally:
        forget_stack(settings.home)
        for signo, handler in previous.items():
            signal.signal(signo, handler)
        metrics_server.shutdown()
        for stop in reversed(stoppers):
            stop()
