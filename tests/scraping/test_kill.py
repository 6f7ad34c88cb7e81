"""A worker process killed with SIGKILL mid-fetch loses nothing: after its leases expire
the sweeper requeues its jobs, another worker completes them, each with one result object.
The fetches are held at the target until the worker is dead (a starved test did not kill
it within the 2 s a slow page took), and its leases are run out in the database, not by
waiting for them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import Engine, text

from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.store import leases, repository
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.repository import JobRequest
from tests.scraping.conftest import TEST_SETTINGS, Worker, stored_objects


def in_flight_attempts(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM scraping.job_attempts WHERE outcome IS NULL")
        ).scalar()


def test_sigkilled_worker_loses_no_job_and_leaves_none_running(
    db_url: str,
    db_engine: Engine,
    make_tenant,
    site: ScrapingTarget,
    work: Worker,
    local_store: LocalResultStore,
    tmp_path: Path,
) -> None:
    tenant, _ = make_tenant("shop")
    ids = [
        repository.submit_job(
            db_engine,
            tenant.id,
            JobRequest(url=f"{site.url}/held/{i}", params={}),
            None,
        ).id
        for i in range(6)
    ]
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_HOME": str(tmp_path),  # the same local store as the `local_store` fixture
        "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32",
        "PIN_SCRAPING_LEASE_SECONDS": "120",
        "PIN_SCRAPING_FETCH_TIMEOUT_SECONDS": "10",
        # All six jobs go to one host: let them run at once.
        "PIN_SCRAPING_DOMAIN_CONCURRENCY": "100",
        "PIN_SCRAPING_DOMAIN_RPS": "1000",
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pin_orchestration.cli",
            "scraping",
            "work",
            "--slots",
            "8",
            "--idle-exit-seconds",
            "30",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120  # a bound for a broken run only
        while in_flight_attempts(db_engine) < 6:
            assert worker.poll() is None, worker.stderr.read().decode()
            assert time.monotonic() < deadline, "the worker never claimed the jobs"
            time.sleep(0.05)
        site.wait_for_requests(6, timeout=120)  # every fetch under way, held
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
    with db_engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM scraping.jobs WHERE status = 'running'")
            ).scalar()
            == 6
        )

    with db_engine.begin() as conn:  # the leases run out: nobody renews them any more
        conn.execute(text("UPDATE scraping.jobs SET lease_expires_at = now() - interval '1 s'"))
    swept = leases.sweep_expired_leases(db_engine, max_attempts=5)
    assert sorted(r.id for r in swept) == sorted(ids)
    assert {r.status for r in swept} == {"queued"}

    site.gate.set()  # the next worker's fetches are answered at once
    report = work(settings=TEST_SETTINGS, idle_exit_seconds=0.5)
    assert report.succeeded == 6
    with db_engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, status, attempts, result_key, result_size FROM scraping.jobs")
        ).all()
        outcomes = conn.execute(
            text(
                "SELECT job_id, array_agg(outcome ORDER BY number) FROM scraping.job_attempts "
                "GROUP BY job_id"
            )
        ).all()
    assert {r.status for r in rows} == {"succeeded"}
    assert {r.attempts for r in rows} == {2}
    assert {tuple(o) for _, o in outcomes} == {("lost", "succeeded")}
    for row in rows:
        assert stored_objects(local_store, row.id) == [row.result_key]
        assert local_store.head(row.result_key).size == row.result_size
    assert {r.id for r in rows} == set(ids) and all(isinstance(i, uuid.UUID) for i in ids)
