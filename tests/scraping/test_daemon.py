"""Worker runs launched by the real Dagster daemon, each in its own OS process, share the
queue and the per-domain limits: every job is taken by exactly one of them, once, and the
site never sees more connections at once than its limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from sqlalchemy import Engine, text

from pin_orchestration.devstack.processes import stop_process_tree
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.platform.db import dagster_storage_url
from pin_orchestration.scraping.store import repository
from pin_orchestration.scraping.store.repository import JobRequest

ROOT = Path(__file__).resolve().parents[2]


def test_daemon_launched_worker_processes_share_the_queue_and_the_domain_limit(
    db_url: str,
    db_engine: Engine,
    make_tenant,
    site: ScrapingTarget,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant, _ = make_tenant("shop")
    ids = [
        repository.submit_job(
            db_engine,
            tenant.id,
            JobRequest(
                # Two domains (two names of the loopback site), 20 jobs each, every answer
                # held until both worker runs hold a job (the gate below).
                url=f"{site.url.replace('127.0.0.1', host)}/held/{i}",
                params={},
            ),
            None,
        ).id
        for i in range(40)
        for host in ["127.0.0.1" if i % 2 else "localhost"]
    ]
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_DAGSTER_PG_URL": dagster_storage_url(db_url),
        "DAGSTER_HOME": str(dagster_home),
        "PIN_HOME": str(tmp_path / "home"),
        "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32",
        "PIN_SCRAPING_SLOTS": "4",
        "PIN_SCRAPING_MAX_WORKER_RUNS": "2",
        # Two runs of 4 slots could open 8 connections to one domain: its limit is 3.
        "PIN_SCRAPING_DOMAIN_CONCURRENCY": "3",
        "PIN_SCRAPING_DOMAIN_RPS": "1000",
        # Held answers wait for the second run's launch: no fetch may time out meanwhile
        # (a starved machine took 100 s to launch both).
        "PIN_SCRAPING_FETCH_TIMEOUT_SECONDS": "400",
        "PIN_SCRAPING_LEASE_SECONDS": "600",
    }
    daemon = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dagster-daemon"),
            "run",
            "-w",
            str(ROOT / "workspace.yaml"),
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # The first run to start could otherwise finish the queue before the daemon
        # launches the second (a loaded machine starts a run in seconds), and answers
        # given at once would never overlap: answers wait until two runs each hold a job
        # and each domain has its limit's 3 requests at the site (8 slots between the
        # runs, 6 places), so sharing the queue and the limit is what is tested.
        deadline = time.monotonic() + 270  # a bound for a broken run (pytest's is 300 s)
        while True:
            with db_engine.connect() as conn:
                holders = conn.execute(
                    text(
                        "SELECT count(DISTINCT lease_owner) FROM scraping.jobs"
                        " WHERE status = 'running'"
                    )
                ).scalar()
            held = {host: site.in_flight[host] for host in ("127.0.0.1", "localhost")}
            if holders >= 2 and all(n >= 3 for n in held.values()):
                break
            assert daemon.poll() is None, "the daemon died"
            assert time.monotonic() < deadline, (
                f"{holders} worker run(s) holding jobs; requests held at the site: {held}"
            )
            time.sleep(0.2)
        site.gate.set()
        while True:
            with db_engine.connect() as conn:
                left = conn.execute(
                    text("SELECT count(*) FROM scraping.jobs WHERE status <> 'succeeded'")
                ).scalar()
            if left == 0:
                break
            assert daemon.poll() is None, "the daemon died"
            assert time.monotonic() < deadline, f"{left} jobs not done"
            time.sleep(0.5)
    finally:
        # The daemon's code server and the worker runs it launched go with it: the code
        # server ignores SIGTERM and would outlive the suite.
        stop_process_tree(daemon.pid)

    with db_engine.connect() as conn:
        attempts = conn.execute(
            text("SELECT job_id, worker, outcome FROM scraping.job_attempts")
        ).all()
    # one attempt per job, all succeeded: nobody took a job another had
    assert sorted(a.job_id for a in attempts) == sorted(ids)
    assert {a.outcome for a in attempts} == {"succeeded"}
    peaks = dict(site.peak_in_flight)
    assert set(peaks) == {"127.0.0.1", "localhost"}, peaks
    assert all(2 <= peak <= 3 for peak in peaks.values()), peaks
    workers = {a.worker for a in attempts}
    assert len(workers) >= 2, workers  # more than one worker run shared the queue
    monkeypatch.setenv("PIN_DAGSTER_PG_URL", env["PIN_DAGSTER_PG_URL"])
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = instance.get_runs(RunsFilter(job_name="scraping_worker"))
        assert {f"run-{r.run_id}" for r in runs} >= workers
        assert all(r.status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.STARTED) for r in runs)
