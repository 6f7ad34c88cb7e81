"""`pin api --workers N`: N API processes on one port, one database (one GIL each)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import requests
from click.testing import CliRunner

from pin_orchestration.cli import main
from tests.conftest import embedded_data_dir
from tests.scraping.apiserver import api_process
from tests.scraping.conftest import auth


def worker_processes(supervisor: int) -> list[psutil.Process]:
    """uvicorn's workers: the supervisor's spawned children (not multiprocessing's
    resource tracker)."""
    return [
        child
        for child in psutil.Process(supervisor).children()
        if any("spawn_main" in part for part in child.cmdline())
    ]


@contextmanager
def stopped(processes: list[psutil.Process]) -> Iterator[None]:
    """SIGSTOP: a stopped worker accepts no connection, so the others must serve."""
    for process in processes:
        os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for process in processes:
            # ProcessLookupError: the supervisor replaced a worker that missed its health check
            with suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)


def test_each_of_two_workers_serves_the_port_over_the_one_database(
    db_url: str, make_tenant, tmp_path: Path
) -> None:
    _, key = make_tenant("shop")
    with api_process(db_url, tmp_path / "api", api_args=("--workers", "2")) as api:
        workers = worker_processes(api.process.pid)
        assert len(workers) == 2, api.log()
        first, second = workers

        # A fresh connection each time (no keep-alive): accepted by the running worker.
        with stopped([second]):
            submitted = requests.post(
                f"{api.url}/jobs",
                json={"url": "https://e.com/a"},
                headers={**auth(key), "Connection": "close"},
                timeout=30,
            )
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]

        with stopped([first]):
            read = requests.get(
                f"{api.url}/jobs/{job_id}",
                headers={**auth(key), "Connection": "close"},
                timeout=30,
            )
        assert read.status_code == 200, read.text
        assert read.json()["status"] == "queued"
    # Stopping `pin api` stops its workers (the supervisor's own reaping; none is left).
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert alive == []


def test_workers_on_the_embedded_default_share_the_one_server_the_supervisor_started() -> None:
    """No PIN_DATABASE_URL: `pin api --workers 2` starts the embedded PostgreSQL once, both
    workers answer /readyz from it, and it stops with the API."""
    with embedded_data_dir() as scratch:
        pgdata = scratch / "home" / "pgdata"
        with api_process(None, scratch / "home", api_args=("--workers", "2")) as api:
            workers = worker_processes(api.process.pid)
            assert len(workers) == 2, api.log()
            for serving in workers:
                with stopped([w for w in workers if w is not serving]):
                    ready = requests.get(
                        f"{api.url}/readyz", headers={"Connection": "close"}, timeout=30
                    )
                assert ready.status_code == 200, (ready.text, api.log())
            assert (pgdata / "postmaster.pid").exists()
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == []
        assert not (pgdata / "postmaster.pid").exists(), "the embedded server outlived the API"


def test_workers_below_one_are_refused_naming_the_option() -> None:
    result = CliRunner().invoke(main, ["api", "--workers", "0"])
    assert result.exit_code == 2
    assert "--workers" in result.output
    assert "0 is not in the range x>=1" in result.output


# Run as `python gated_pin.py api …`: the script is `pin`, except that each API worker,
# which multiprocessing's spawn starts by importing the parent's main script (here as
# `__mp_main__`; with the `pin` console script, all of pin_orchestration.cli) before it can
# answer the supervisor's health check, waits at a file gate first — what a machine whose
# load is 6-14 does to that import (2 s of CPU), made deterministic.
GATED_PIN = """
import os
import pathlib
import time

if __name__ == "__mp_main__":
    gate = pathlib.Path(os.environ["PIN_TEST_WORKER_GATE"])
    (gate.parent / f"worker-{os.getpid()}").touch()
    while not gate.exists():
        time.sleep(0.05)

from pin_orchestration.cli import main

if __name__ == "__main__":
    main()
"""


def test_workers_slow_to_start_are_not_killed_by_the_supervisors_health_check(
    db_url: str, tmp_path: Path
) -> None:
    """Under load, `pin api --workers 2` restarted its workers again and again ("Child
    process … died") and never served: uvicorn's supervisor pings each worker and kills
    one that does not answer within `timeout_worker_healthcheck` (5 s by default), and a
    worker answers only once its startup imports are done. Here both workers are held at
    their start for three times that window: none may be replaced, and the API serves once
    they are let go."""
    import inspect
    import subprocess
    import sys
    import time

    import uvicorn

    from tests.scraping.apiserver import ROOT
    from tests.scraping.conftest import free_loopback_port

    default_window = (
        inspect.signature(uvicorn.Config).parameters["timeout_worker_healthcheck"].default
    )
    script = tmp_path / "gated_pin.py"
    script.write_text(GATED_PIN)
    gates = tmp_path / "gates"
    gates.mkdir()
    gate = gates / "open"
    port = free_loopback_port()
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_HOME": str(tmp_path / "home"),
        "PIN_TEST_WORKER_GATE": str(gate),
    }
    env.pop("PIN_REDIS_URL", None)
    log_path = tmp_path / "api.log"
    command = [sys.executable, str(script), "api", "--port", str(port), "--workers", "2"]
    with log_path.open("wb") as log:
        api = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def started() -> list[Path]:
        return sorted(gates.glob("worker-*"))

    try:
        deadline = time.monotonic() + 120
        while len(started()) < 2 and time.monotonic() < deadline and api.poll() is None:
            time.sleep(0.1)
        assert len(started()) == 2, log_path.read_text()
        # Held at the gate for three of uvicorn's default windows: a supervisor that kills
        # a worker missing its health check has replaced one by then (a third marker).
        held_until = time.monotonic() + 3 * default_window
        while time.monotonic() < held_until and len(started()) == 2:
            time.sleep(0.1)
        assert len(started()) == 2, f"a held worker was replaced: {log_path.read_text()}"
        gate.touch()
        deadline = time.monotonic() + 120
        serving = False
        while not serving and time.monotonic() < deadline and api.poll() is None:
            try:
                serving = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=30).ok
            except (requests.ConnectionError, requests.Timeout):
                time.sleep(0.1)
        log_text = log_path.read_text()
        assert serving, log_text
        assert "died" not in log_text and len(started()) == 2, log_text
    finally:
        gate.touch()
        api.terminate()
        try:
            api.wait(30)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait(10)
