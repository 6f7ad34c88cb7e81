"""A hostile target, a hostile clock and a racing worker against the worker's promises
(docs/jobs/scraping.md "Scheduling", "Retries"): attempts never exceed max_attempts, a
target's Retry-After is never cut short, every job reaches a terminal state. Real
PostgreSQL, loopback targets, orders of events held by gates."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import Any

from sqlalchemy import Engine, text

from pin_orchestration.devstack.standins.hostile_peer import HostilePeer
from pin_orchestration.scraping import repository
from pin_orchestration.scraping.repository import JobRequest
from tests.scraping.conftest import TEST_SETTINGS, Worker


def enqueue(engine: Engine, tenant_id: uuid.UUID, url: str) -> uuid.UUID:
    return repository.submit_job(engine, tenant_id, JobRequest(url=url, params={}), None).id


def job_and_attempts(engine: Engine, job_id: uuid.UUID) -> tuple[Any, list[Any]]:
    with engine.connect() as conn:
        job = conn.execute(text("SELECT * FROM scraping.jobs WHERE id = :id"), {"id": job_id}).one()
        rows = conn.execute(
            text("SELECT * FROM scraping.job_attempts WHERE job_id = :id ORDER BY number"),
            {"id": job_id},
        ).all()
    return job, rows


def test_a_run_stopped_during_a_jobs_last_attempt_does_not_grant_it_another(
    db_engine: Engine, make_tenant: Any, work: Worker
) -> None:
    """A stopped run hands its jobs back at once (`worker_stopped`), and the claim counts
    that attempt: on the last attempt of the budget the hand-back queued the job for
    attempt max_attempts + 1 (a run stopped on every deploy fetched a slow page without
    end). Like a lost attempt the sweeper finds on the last of the budget, it fails."""
    settings = dataclasses.replace(TEST_SETTINGS, max_attempts=1, fetch_timeout_seconds=30)
    tenant = make_tenant("stopped")[0]
    stop = threading.Event()
    with HostilePeer() as peer:
        # Headers at once, then a byte every 0.1 s: the attempt is in flight until stopped.
        job_id = enqueue(db_engine, tenant.id, peer.url("drip-body", "last"))
        reached = threading.Event()

        def stop_once_reached() -> None:
            # The gate: the peer has read the attempt's request.
            while not any(r.name == "last" for r in peer.seen()):
                if reached.wait(0.01):
                    return
            stop.set()

        stopper = threading.Thread(target=stop_once_reached)
        stopper.start()
        try:
            work(settings=settings, stop=stop, idle_exit_seconds=30)
        finally:
            reached.set()
            stopper.join()
        # Any later run: nothing left to fetch.
        work(settings=settings)
        fetches = sum(r.name == "last" for r in peer.seen())

    job, rows = job_and_attempts(db_engine, job_id)
    assert fetches == 1
    assert job.attempts == len(rows) == 1
    assert job.status == "failed" and job.finished_at is not None
    assert [(a.outcome, a.error_class) for a in rows] == [("failed", "worker_stopped")]
