"""`pin up`: the whole system on one machine — database, migrations, demo data, local
stand-ins for external services, the metrics endpoint, and Dagster (webserver + daemon).

Every external part is switched to a real one by environment variables, never by code:
PIN_DATABASE_URL (else the embedded PostgreSQL under PIN_HOME), PIN_SELECTIONS_URL (else
the selections stand-in on 127.0.0.1:8790), PIN_KAFKA_BOOTSTRAP_SERVERS (else chessboard
events go to $PIN_HOME/chessboard-events.jsonl).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import psutil
from dagster import DagsterInstance
from sqlalchemy import Engine

from pin_orchestration.areas import metric_collectors
from pin_orchestration.devstack.demo import seed_demo_data
from pin_orchestration.devstack.stack_recovery import (
    STACK_VARIABLE,
    clear_previous_stack,
    fail_runs_left_behind,
    forget_stack,
    kill_processes,
    new_stack_id,
    record_stack,
    stack_processes,
)
from pin_orchestration.migrations import upgrade_database
from pin_orchestration.news.snapshot_detach.monitoring import (
    DEMO_QUARANTINE_NOTE,
    demo_quarantined_ids,
)
from pin_orchestration.platform.dagster_warnings import pythonwarnings_value
from pin_orchestration.platform.db import (
    create_db_engine,
    dagster_storage_url,
    resolve_database_url,
)
from pin_orchestration.platform.defaults import API_PORT, DAGSTER_HOME_DIR, DAGSTER_YAML, PGDATA_DIR
from pin_orchestration.platform.metrics import serve_metrics
from pin_orchestration.platform.settings import Settings
from pin_orchestration.sensors.run_failures import RUN_STATUS_SENSOR_PROCESS_LIMIT

log = logging.getLogger(__name__)

# What stops `pin up` when sent to its PID alone (kill PID, systemd, docker stop, Ctrl-C).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The stop, Dagster first. dagster dev stops its webserver and daemon (it gives each 60 s
# before it kills it); once they are gone no run starts any more, and its code servers and
# the runs' workers are interrupted, with this long to stop before what is left is killed.
SERVICES_STOP_SECONDS = 130.0
INTERRUPTED_STOP_SECONDS = 10.0
# Dagster's processes by their command line's words: the webserver and the daemon, the code
# servers (a run worker is a code server's child).
WEBSERVER_AND_DAEMON = ({"dagster_webserver"}, {"dagster._daemon"})
CODE_SERVERS = ({"code-server"}, {"api", "grpc"})


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
    home = settings.home / DAGSTER_HOME_DIR
    home.mkdir(parents=True, exist_ok=True)
    text = dagster_yaml.read_text()
    if "python_logs:" not in text:
        # The runs' system loggers (run and step events) print at this level; the event log,
        # hence the UI, keeps every event.
        text += f"\npython_logs:\n  python_log_level: {run_log_level}\n"
    (home / DAGSTER_YAML.name).write_text(text)
    return home


def start_local_services(
    settings: Settings, env: dict[str, str], *, seed_demo: bool = True
) -> list[Callable[[], None]]:
    """Start what stands in for external services; returns how to stop each.

    An area whose external service is unset adds its stand-in here and exports its URL
    into `env`, so the Dagster processes started afterwards use it.
    """
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
    stoppers.append(start_pin_command(["chessboard", "publish"], env))
    return stoppers


def start_pin_command(args: list[str], env: dict[str, str]) -> Callable[[], None]:
    """`pin ARGS…` as a child process; returns how to stop it (SIGTERM, then SIGKILL
    after 10 s)."""
    process = subprocess.Popen([sys.executable, "-m", "pin_orchestration.cli", *args], env=env)

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()

    return stop


def start_scraping_services(
    settings: Settings, env: dict[str, str], *, seed_demo: bool
) -> list[Callable[[], None]]:
    """The scraping API (`pin api`); with the demo, the demo target site, the demo tenant
    (its key is printed) and a few jobs."""
    from pin_orchestration.devstack.demo import ensure_demo_tenant, submit_demo_jobs
    from pin_orchestration.devstack.standins.scraping_target import DEFAULT_PORT, ScrapingTarget

    api_host, api_port = env["PIN_API_HOST"], env["PIN_API_PORT"]
    env.setdefault("PIN_API_PUBLIC_URL", f"http://{api_host}:{api_port}")
    stop_api = start_pin_command(["api", "--host", api_host, "--port", api_port], env)
    api_url = env["PIN_API_PUBLIC_URL"]
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
    api_port: int = API_PORT,
    seed_demo: bool = True,
    log_level: str = "info",
) -> int:
    # First: beside a live stack nothing else may start (StackAlreadyRunning).
    previous_stack_died = clear_previous_stack(settings.home)
    database_url = resolve_database_url(settings)
    engine = prepare_database(settings, database_url, seed_demo=seed_demo)
    # An idle stack stays quiet: Dagster's daemon logs every sensor tick at INFO and a run
    # prints its DEBUG events; the UI keeps them all. `pin --log-level debug up` shows them.
    dagster_level = "debug" if log_level == "debug" else "warning"
    env = stack_environment(
        settings, database_url, dagster_yaml, dagster_level, host=host, api_port=api_port
    )
    if previous_stack_died:
        fail_runs_left_behind(_dagster_instance(env))
    stoppers = start_local_services(settings, env, seed_demo=seed_demo)
    metrics_server = serve_metrics(metric_collectors(engine), host, metrics_port)
    log.info("metrics on http://%s:%d/metrics", host, metrics_port)
    stoppers.append(metrics_server.shutdown)  # stopped first
    log.info("Dagster UI on http://%s:%d", host, port)
    return run_dagster(
        settings,
        env,
        dagster_dev_command(workspace_yaml, host, port, dagster_level),
        stoppers,
    )


def prepare_database(settings: Settings, database_url: str, *, seed_demo: bool) -> Engine:
    """The database migrated to head, with the demo data unless told not to."""
    if settings.database_url is None:
        log.info("embedded PostgreSQL running, data in %s", settings.home / PGDATA_DIR)
    upgrade_database(database_url)
    engine = create_db_engine(database_url)
    if seed_demo:
        log.info("demo data: %s", seed_demo_data(engine))
        log_demo_failures(engine)
    return engine


def stack_environment(
    settings: Settings,
    database_url: str,
    dagster_yaml: Path,
    dagster_level: str,
    *,
    host: str,
    api_port: int,
) -> dict[str, str]:
    """The environment of every process the stack starts."""
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
    return env


def dagster_dev_command(workspace_yaml: Path, host: str, port: int, level: str) -> list[str]:
    return [
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
        level,
        "--code-server-log-level",
        level,
    ]


def run_dagster(
    settings: Settings,
    env: dict[str, str],
    command: list[str],
    stoppers: list[Callable[[], None]],
) -> int:
    """Run dagster dev until it exits or the stack is told to stop; then stop Dagster, then
    what `stoppers` stop (the last first). Returns the exit code of `pin up`."""
    # Its own session: a terminal's Ctrl-C reaches only `pin up`, which then stops Dagster
    # exactly once, the same way as for a signal sent to `pin up`'s PID alone. Every Dagster
    # process carries the stack's id (STACK_VARIABLE): see end_dagster.
    # cwd is DAGSTER_HOME so dagster dev does not warn that the repository's dagster.yaml
    # (the source of the copy there) is ignored. A process started in the background
    # inherits an ignored SIGINT: give it the default back so it can be stopped.
    stack_id = new_stack_id()
    dagster_dev = subprocess.Popen(
        command,
        env={**env, STACK_VARIABLE: stack_id},
        cwd=Path(env["DAGSTER_HOME"]),
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    stopping: list[float] = []  # when the stop began

    def stop_dagster(_signo: int, _frame: FrameType | None) -> None:
        if stopping:  # a second Ctrl-C: the stop is under way, and bounded
            return
        stopping.append(time.monotonic())
        log.info("stopping: Dagster first, the database last")
        # SIGINT is how dagster dev stops its webserver and daemon cleanly: see end_dagster.
        dagster_dev.send_signal(signal.SIGINT)

    previous = {signo: signal.signal(signo, stop_dagster) for signo in STOP_SIGNALS}
    record_stack(settings.home, dagster_dev_pid=dagster_dev.pid, stack_id=stack_id)
    try:
        while dagster_dev.poll() is None and not stopping:
            with contextlib.suppress(subprocess.TimeoutExpired):
                dagster_dev.wait(timeout=0.5)
        # Dagster first: while its processes finish (a run records its end) the database
        # they write to is still up. The embedded PostgreSQL stops last, when this process
        # exits.
        end_dagster(stack_id, dagster_dev)
        if stopping:
            log.info("Dagster stopped in %.1f s", time.monotonic() - stopping[0])
            return 0
        return dagster_dev.returncode
    finally:
        forget_stack(settings.home)
        for stop in reversed(stoppers):
            stop()
        if stopping:
            log.info("stopped in %.1f s", time.monotonic() - stopping[0])
        for signo, handler in previous.items():
            signal.signal(signo, handler)


def end_dagster(stack_id: str, dagster_dev: subprocess.Popen[bytes]) -> None:
    """Stop every Dagster process of the stack, before the database stops under them.

    Told alone, dagster dev stops its webserver and daemon, asks its code servers to shut
    down once their runs end, and exits: they outlived `pin up`, retrying the stopped
    database forever. What outlives it is re-parented to init; the stack's id in their
    environment finds them all. Once the webserver and the daemon have stopped, no run is
    starting (a run worker interrupted while it imports its code prints a traceback, and
    the daemon launching it another): then the code servers and the runs' workers are sent
    SIGINT, as a terminal's Ctrl-C to `dagster dev` gives them — a run stops and is
    recorded as interrupted, a code server stops — and what has not stopped
    INTERRUPTED_STOP_SECONDS later is killed (a run worker that recorded its end can hang
    in its exit, and a code server finishes its calls for up to 60 s)."""
    deadline = time.monotonic() + SERVICES_STOP_SECONDS
    while (
        dagster_dev.poll() is None
        and _matching(stack_processes(stack_id), WEBSERVER_AND_DAEMON)
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    left = stack_processes(stack_id)
    # The webserver and the daemon too if dagster dev died first: nothing told them.
    servers = {process.pid for process in _matching(left, CODE_SERVERS + WEBSERVER_AND_DAEMON)}
    for process in left:
        with contextlib.suppress(psutil.Error):
            if process.pid in servers or process.ppid() in servers:
                process.send_signal(signal.SIGINT)
    psutil.wait_procs(left, timeout=INTERRUPTED_STOP_SECONDS)
    stuck = stack_processes(stack_id)  # those started meanwhile too
    if stuck:
        log.info(
            "%d Dagster process(es) not stopped %.0f s after SIGINT, killed: %s",
            len(stuck),
            INTERRUPTED_STOP_SECONDS,
            ", ".join(str(process.pid) for process in stuck),
        )
        kill_processes(stuck)
    with contextlib.suppress(subprocess.TimeoutExpired):
        dagster_dev.wait(timeout=1)  # reaped


def _matching(processes: list[psutil.Process], kinds: tuple[set[str], ...]) -> list[psutil.Process]:
    """The processes whose command line holds every word of one of `kinds`."""
    found = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            words = set(process.cmdline())
            if any(kind <= words for kind in kinds):
                found.append(process)
    return found
