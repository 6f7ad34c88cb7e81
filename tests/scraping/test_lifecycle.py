"""A job's lifecycle under races, with the parties in processes or connections of their own:
a cancel asked for while an attempt runs wins over whatever the attempt ends with; a late
worker's put never changes the object a job reports; a worker rides out its database
going away (issue 16, items 1-3)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, text

from faults.postgres import database_url_via, proxy_in_front_of
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.store import leases, repository
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.repository import JobRequest
from tests.scraping.apiserver import api_process
from tests.scraping.conftest import TEST_SETTINGS, Worker, auth, stored_objects


def job_row(engine: Engine, job_id: uuid.UUID | str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM scraping.jobs WHERE id = :id"), {"id": job_id}
        ).one()


def attempt_outcomes(engine: Engine, job_id: uuid.UUID | str) -> list[str | None]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT outcome FROM scraping.job_attempts WHERE job_id = :id ORDER BY number"
                ),
                {"id": job_id},
            ).scalars()
        )


def worker_process(
    db_url: str, home: Path, log_path: Path, *, lease_seconds: float = 120, idle_exit: float = 1
) -> subprocess.Popen[bytes]:
    """`pin scraping work` in a process of its own, logging to `log_path`. Its lease (and so
    how long a stopping run keeps trying to write) is what no starved run outlasts."""
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_HOME": str(home),  # the same local store as the `local_store` fixture
        "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32",
        "PIN_SCRAPING_LEASE_SECONDS": str(lease_seconds),
        "PIN_SCRAPING_FETCH_TIMEOUT_SECONDS": "60",
        "PIN_SCRAPING_MAX_ATTEMPTS": "5",
        "PIN_SCRAPING_BACKOFF_BASE_SECONDS": "0.05",
        "PIN_SCRAPING_BACKOFF_CAP_SECONDS": "0.1",
        "PIN_SCRAPING_DOMAIN_CONCURRENCY": "100",
        "PIN_SCRAPING_DOMAIN_RPS": "1000",
    }
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pin_orchestration.cli",
                "scraping",
                "work",
                "--slots",
                "8",
                "--idle-exit-seconds",
                str(idle_exit),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_for(condition: Any, what: str, timeout: float = 120) -> None:
    """Until `condition()`; `timeout` only ends a broken run (a starved one is slow)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def held() -> Iterator[ScrapingTarget]:
    """A target for /held/ pages: their answers wait for `held.gate`."""
    target = ScrapingTarget().start()
    yield target
    target.stop()


@pytest.fixture
def held_503() -> Iterator[ScrapingTarget]:
    target = ScrapingTarget().start()
    yield target
    target.stop()


def test_a_cancel_asked_while_running_wins_over_a_retry_and_a_success(
    db_url: str,
    db_engine: Engine,
    make_tenant,
    held: ScrapingTarget,
    held_503: ScrapingTarget,
    local_store: LocalResultStore,
    tmp_path: Path,
) -> None:
    """Both attempts are held at the target while the client cancels over HTTP; then one
    answers 503 (a retry), the other 200 (a success). Both jobs end cancelled, the target
    sees no second request, the fetched body is not kept. A job that succeeded before its
    cancel keeps its result."""
    tenant, key = make_tenant("shop")
    with api_process(db_url, tmp_path / "api") as api:

        def submit(url: str) -> str:
            answer = requests.post(
                f"{api.url}/jobs", json={"url": url, "params": {}}, headers=auth(key), timeout=60
            )
            assert answer.status_code == 202, answer.text
            return answer.json()["id"]

        retried, fetched = (
            submit(f"{held_503.url}/held/retry?status=503"),
            submit(f"{held.url}/held/ok"),
        )
        worker = worker_process(db_url, tmp_path, tmp_path / "worker.log")
        try:
            held_503.wait_for_requests(1, timeout=120)
            held.wait_for_requests(1, timeout=120)
            for job_id in (retried, fetched):
                answer = requests.post(
                    f"{api.url}/jobs/{job_id}/cancel", headers=auth(key), timeout=60
                )
                assert answer.status_code == 200, answer.text
                assert answer.json() == {
                    "id": job_id,
                    "status": "running",
                    "cancel_requested": True,
                }
            held_503.gate.set()
            held.gate.set()
            assert worker.wait(timeout=120) == 0, (tmp_path / "worker.log").read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

        for job_id in (retried, fetched):
            row = job_row(db_engine, job_id)
            assert (row.status, row.result_key, row.last_error_class) == (
                "cancelled",
                None,
                "cancelled",
            ), job_id
            assert row.finished_at is not None
            read = requests.get(f"{api.url}/jobs/{job_id}", headers=auth(key), timeout=60)
            assert read.json()["status"] == "cancelled"
        assert len(held_503.requests) == 1 and len(held.requests) == 1
        assert attempt_outcomes(db_engine, retried) == ["retry"]
        assert stored_objects(local_store, uuid.UUID(fetched)) == []

        # A success written before the cancel stands.
        done = submit(f"{held.url}/held/done")
        worker = worker_process(db_url, tmp_path, tmp_path / "worker2.log")
        assert worker.wait(timeout=120) == 0, (tmp_path / "worker2.log").read_text()
        answer = requests.post(f"{api.url}/jobs/{done}/cancel", headers=auth(key), timeout=60)
        assert answer.status_code == 409
        row = job_row(db_engine, done)
        assert row.status == "succeeded"
        assert local_store.head(row.result_key).sha256 == row.result_sha256


def test_a_late_workers_put_never_changes_the_object_a_job_reports(
    db_engine: Engine,
    make_tenant,
    held: ScrapingTarget,
    work: Worker,
    local_store: LocalResultStore,
) -> None:
    """Worker A passes its lease check, then stalls in its put; its lease is swept, worker B
    (its own connections) fetches and stores again and succeeds. A's put then lands: the
    object B's finish recorded is unchanged, and A's own object is deleted."""
    tenant, _ = make_tenant("shop")
    job_id = repository.submit_job(
        db_engine, tenant.id, JobRequest(url=f"{held.url}/held/page", params={}), None
    ).id
    held.gate.set()
    in_put, resume = threading.Event(), threading.Event()

    class StallingStore:
        def __getattr__(self, name: str) -> Any:
            return getattr(local_store, name)

        def put(self, key: str, body: Any, **kw: Any) -> Any:
            in_put.set()
            assert resume.wait(120)
            return local_store.put(key, body, **kw)

    settings = dataclasses.replace(TEST_SETTINGS, lease_seconds=30)
    # A's one slot is its stalled job, so its poll cannot take the swept job back before B
    # claims it (with free slots it did, on a loaded machine: B then claimed nothing).
    late_settings = dataclasses.replace(settings, slots=1)
    reports: dict[str, Any] = {}
    late = threading.Thread(
        target=lambda: reports.update(a=work(store=StallingStore(), settings=late_settings))
    )
    late.start()
    try:
        assert in_put.wait(120)
        with db_engine.begin() as conn:  # A's lease runs out while it stalls
            conn.execute(
                text("UPDATE scraping.jobs SET lease_expires_at = now() - interval '1 second'")
            )
        assert [r.id for r in leases.sweep_expired_leases(db_engine, max_attempts=5)] == [job_id]
        reports["b"] = work(settings=settings)
    finally:
        resume.set()
        late.join(timeout=120)
    assert reports["b"].succeeded == 1 and reports["a"].lease_lost == 1

    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts) == ("succeeded", 2)
    body = local_store.read_bytes(row.result_key)
    assert hashlib.sha256(body).hexdigest() == row.result_sha256 and len(body) == row.result_size
    assert body.startswith(b"answer 2 ")
    assert stored_objects(local_store, job_id) == [row.result_key]
    assert attempt_outcomes(db_engine, job_id) == ["lost", "succeeded"]


def test_a_worker_rides_out_its_database_going_away_and_fetches_nothing_twice(
    db_url: str,
    db_engine: Engine,
    make_tenant,
    held: ScrapingTarget,
    local_store: LocalResultStore,
    tmp_path: Path,
) -> None:
    """The worker's only way to PostgreSQL is a proxy. With four fetches in flight every
    connection is cut and new ones refused; the fetches complete, the writes fail, the run
    is even asked to stop (SIGTERM) — and once the database is back, every outcome is
    written: four successes, one attempt each, the target asked once per job."""
    tenant, _ = make_tenant("shop")
    ids = [
        repository.submit_job(
            db_engine, tenant.id, JobRequest(url=f"{held.url}/held/p{i}", params={}), None
        ).id
        for i in range(4)
    ]
    log_path = tmp_path / "worker.log"
    with proxy_in_front_of(db_url) as proxy:
        worker = worker_process(
            f"{database_url_via(db_url, proxy)}?connect_timeout=5", tmp_path, log_path
        )
        try:
            held.wait_for_requests(4, timeout=120)
            proxy.set_mode("down")  # every connection reset, new ones refused
            held.gate.set()
            wait_for(
                lambda: "outcomes failed" in log_path.read_text() or worker.poll() is not None,
                "the worker failing to write its outcomes",
            )
            assert worker.poll() is None, log_path.read_text()
            worker.send_signal(signal.SIGTERM)  # stopped while its outcomes are unwritten
            wait_for(
                lambda: log_path.read_text().count("outcomes failed") >= 2,
                "a second failed write",
            )
            assert job_row(db_engine, ids[0]).status == "running"
            proxy.set_mode("pass")
            assert worker.wait(timeout=120) == 0, log_path.read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for job_id in ids:
        row = job_row(db_engine, job_id)
        assert (row.status, row.attempts) == ("succeeded", 1), log_path.read_text()
        assert attempt_outcomes(db_engine, job_id) == ["succeeded"]
        assert stored_objects(local_store, job_id) == [row.result_key]
    assert sorted(held.requests) == [f"/held/p{i}" for i in range(4)]
