"""Races between a worker run's own attempts, the sweeper and other runs, with real
connections and gates: a run that claims its own swept job again keeps the new attempt."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import Engine, text

from pin_orchestration.scraping import repository
from pin_orchestration.scraping.store import LocalResultStore
from tests.scraping.conftest import TEST_SETTINGS
from tests.scraping.test_worker import attempts, enqueue, job_row


class GatedTarget:
    """Request number n (from 1) waits for `release(n)`, then answers 200 `answer n`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self.arrivals = 0
        self._gates: dict[int, threading.Event] = {}
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                with target._arrived:
                    target.arrivals += 1
                    n = target.arrivals
                    gate = target._gate(n)
                    target._arrived.notify_all()
                gate.wait(30)
                body = f"answer {n}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _gate(self, n: int) -> threading.Event:
        return self._gates.setdefault(n, threading.Event())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def wait_for_arrival(self, n: int, timeout: float = 20) -> None:
        with self._arrived:
            assert self._arrived.wait_for(lambda: self.arrivals >= n, timeout), (
                f"request {n} never arrived"
            )

    def release(self, n: int) -> None:
        with self._lock:
            self._gate(n).set()

    def stop(self) -> None:
        with self._lock:
            for gate in self._gates.values():
                gate.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def gated() -> Iterator[GatedTarget]:
    target = GatedTarget()
    yield target
    target.stop()


def _sweep_now(engine: Engine, job_id: uuid.UUID) -> None:
    """The job's lease runs out and the sweeper requeues it, in one transaction (the row
    locked throughout, so no renewal slips in between)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET lease_expires_at = now() - interval '1 second' "
                "WHERE id = :id AND status = 'running'"
            ),
            {"id": job_id},
        )
        swept = conn.execute(
            repository._q("sweep_expired_leases"), {"max_attempts": 5, "limit": 10}
        ).all()
    assert [r.id for r in swept] == [job_id]


def _lease_expires_at(engine: Engine, job_id: uuid.UUID) -> Any:
    return job_row(engine, job_id).lease_expires_at


def test_a_run_that_claims_its_own_swept_job_again_keeps_the_new_attempt(
    db_engine: Engine,
    make_tenant: Any,
    gated: GatedTarget,
    local_store: LocalResultStore,
) -> None:
    from pin_orchestration.resources.scraping import fetch_policy_from, retry_policy_from
    from pin_orchestration.scraping.fetch import Fetcher
    from pin_orchestration.scraping.worker import WorkerOptions, run_worker
    from tests.scraping.conftest import _with_allowed

    tenant_id = make_tenant("shop")[0].id
    job_id = enqueue(db_engine, tenant_id, f"{gated.url}/x")
    settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
    stop = threading.Event()
    reports: list[Any] = []
    fetcher = Fetcher(fetch_policy_from(settings))
    options = WorkerOptions(
        slots=4,
        lease_seconds=1.5,
        idle_exit_seconds=0.5,
        max_run_duration_seconds=60,
        poll_seconds=0.05,
        domain_rps=settings.domain_rps,
        domain_concurrency=settings.domain_concurrency,
    )
    run = threading.Thread(
        target=lambda: reports.append(
            run_worker(
                db_engine,
                local_store,
                fetcher,
                retry_policy_from(settings),
                options,
                stop=stop,
            )
        )
    )
    run.start()
    try:
        gated.wait_for_arrival(1)  # attempt 1 is fetching
        _sweep_now(db_engine, job_id)
        gated.wait_for_arrival(2)  # the same run claimed the job again: attempt 2
        assert job_row(db_engine, job_id).attempts == 2
        gated.release(1)  # attempt 1's slot ends (its outcome is refused: not its lease)
        # Attempt 2's lease is still renewed after attempt 1's slot has ended: it moves
        # forward twice (renewals come every lease / 3).
        seen = [_lease_expires_at(db_engine, job_id)]
        deadline = threading.Event()
        timer = threading.Timer(3 * options.lease_seconds, deadline.set)
        timer.start()
        while len(seen) < 3 and not deadline.is_set():
            now = _lease_expires_at(db_engine, job_id)
            if now is not None and now > seen[-1]:
                seen.append(now)
            deadline.wait(0.05)
        timer.cancel()
        assert len(seen) == 3, f"attempt 2's lease stopped being renewed: {seen}"
        gated.release(2)
        run.join(30)
    finally:
        stop.set()
        gated.stop()
        run.join(30)
        fetcher.close()
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts) == ("succeeded", 2)
    assert local_store.read_bytes(row.result_key) == b"answer 2"
    assert [(a.number, a.outcome) for a in attempts(db_engine, job_id)] == [
        (1, "lost"),
        (2, "succeeded"),
    ]
