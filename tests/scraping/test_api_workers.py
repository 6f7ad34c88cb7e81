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
