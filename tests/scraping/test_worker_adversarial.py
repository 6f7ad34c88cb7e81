"""A hostile target, a hostile clock and a racing worker against the worker's promises
(docs/jobs/scraping.md "Scheduling", "Retries"): attempts never exceed max_attempts, a
target's Retry-After is never cut short, every job reaches a terminal state. Real
PostgreSQL, loopback targets, orders of events held by gates."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import select
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from faults.postgres import database_url_via, proxy_in_front_of
from pin_orchestration.devstack.standins.hostile_peer import HostilePeer
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.fetch import robots_rows
from pin_orchestration.scraping.fetch.client import Fetcher, FetchPolicy
from pin_orchestration.scraping.policies import fetch_policy_from, retry_policy_from
from pin_orchestration.scraping.store import leases, repository
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.worker.options import WorkerOptions
from pin_orchestration.scraping.worker.run import claim_due_jobs, run_worker
from tests.log_gates import LogSeen
from tests.scraping.conftest import TEST_SETTINGS, LeaseClock, Worker, _with_allowed


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


def test_a_clock_stepping_between_the_decision_and_its_write_does_not_cut_retry_after(
    db_engine: Engine, make_tenant: Any, site: ScrapingTarget, local_store: LocalResultStore
) -> None:
    """A 429 asks for 3000 s; the worker's clock steps an hour forward after the slot
    decided "not before now + 3000 s" and before the round writes it (an NTP step, or an
    outcome held through a database outage while the clock moved). The write measured the
    moment against the stepped clock: 3000 s - 3600 s from now, so the retry was due at
    once and the domain not paused at all, and the target was asked again at once. (The
    figures leave a starved run 100 s between the decision and the check.)"""
    tenant = make_tenant("stepped")[0]
    job_id = enqueue(db_engine, tenant.id, f"{site.url}/status/429?retry_after=3000")
    run_thread = threading.current_thread()
    step = timedelta(hours=1)

    def stepped_clock() -> datetime:
        # Slots decide on their own threads; the run's thread writes the round: it reads
        # the clock after the step, the deciding slot before it.
        now = datetime.now(UTC)
        return now + step if threading.current_thread() is run_thread else now

    settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
    with Fetcher(fetch_policy_from(settings)) as fetcher:
        run_worker(
            db_engine,
            local_store,
            fetcher,
            retry_policy_from(settings),
            WorkerOptions(
                slots=2,
                lease_seconds=settings.lease_seconds,
                idle_exit_seconds=0.5,
                max_run_duration_seconds=30,
                poll_seconds=0.05,
                domain_rps=settings.domain_rps,
                domain_concurrency=settings.domain_concurrency,
            ),
            rng=random.Random(7),
            clock=stepped_clock,
        )
    with db_engine.connect() as conn:
        retry_in, paused_for = conn.execute(
            text(
                "SELECT extract(epoch FROM j.next_attempt_at - now()),"
                "       extract(epoch FROM d.blocked_until - now())"
                " FROM scraping.jobs j LEFT JOIN scraping.domains d ON d.domain = j.domain"
                " WHERE j.id = :id"
            ),
            {"id": job_id},
        ).one()
    job, rows = job_and_attempts(db_engine, job_id)
    assert [(a.outcome, a.http_status) for a in rows] == [("retry", 429)]
    assert job.status == "queued"
    assert 2900 <= retry_in <= 3000
    assert paused_for is not None and 2900 <= paused_for <= 3000


class _DripTarget:
    """Headers, then a byte every 50 ms of a long body (or, `answers=False`, nothing at
    all: the request taken, never answered); records when the client closed its
    connection (seen as the end of the stream it sends), by wall clock, to compare with a
    lease's end in PostgreSQL (the same machine's clock)."""

    def __init__(self, answers: bool = True) -> None:
        self.answers = answers
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.reached = threading.Event()
        self.closed = threading.Event()
        self.closed_at: float | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(65536)
            self.reached.set()
            if self.answers:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not self._stopping.is_set():
                readable, _, _ = select.select([conn], [], [], 0.05)
                if readable and conn.recv(1, socket.MSG_PEEK) == b"":
                    break
                if not self.answers:
                    continue
                try:
                    conn.sendall(b"x")
                except OSError:
                    break
            self.closed_at = time.time()
            self.closed.set()

    def stop(self) -> None:
        self._stopping.set()
        self.listener.close()
        self._thread.join(timeout=10)


@pytest.mark.parametrize("waiting_for", ["body", "headers"])
def test_a_worker_that_cannot_renew_its_lease_stops_fetching_before_the_lease_ends(
    db_url: str,
    db_engine: Engine,
    make_tenant: Any,
    local_store: LocalResultStore,
    waiting_for: str,
) -> None:
    """A worker cut off from PostgreSQL (its renewals fail) while its fetch still reads a
    slow body: the lease runs out, the sweeper requeues the job and another worker fetches
    it, while the first went on reading until its fetch deadline (20 s here): two requests
    of one job at the target at once, and the host's connection limit exceeded. It must
    hang up before the lease it can no longer confirm ends, as it refuses to store then —
    also while it waits for the answer's headers (a target that never answers): only the
    body's reads looked at the lease, so a fetch timeout longer than the lease let a
    fetch outlive it.

    The run's lease clock is the test's: it moves to nine tenths of the lease once the
    database is cut (past the doubt, short of the end), and nothing else moves it, so a
    starved machine neither loses the lease early nor lets the wall clock decide."""
    settings = dataclasses.replace(
        _with_allowed(TEST_SETTINGS, "127.0.0.1/32"),
        lease_seconds=120,
        fetch_timeout_seconds=300,
        max_result_bytes=1_000_000,
    )
    clock = LeaseClock()
    tenant = make_tenant("cutoff")[0]
    target = _DripTarget(answers=waiting_for == "body")
    job_id = enqueue(db_engine, tenant.id, f"{target.url}/slow")
    stop = threading.Event()
    with proxy_in_front_of(db_url) as proxy:
        engine = create_engine(database_url_via(db_url, proxy), poolclass=NullPool)
        fetcher = Fetcher(fetch_policy_from(settings))
        run = threading.Thread(
            target=run_worker,
            args=(engine, local_store, fetcher, retry_policy_from(settings)),
            kwargs={
                "options": WorkerOptions(
                    slots=1,
                    lease_seconds=settings.lease_seconds,
                    idle_exit_seconds=60,
                    max_run_duration_seconds=60,
                    poll_seconds=0.05,
                    domain_rps=settings.domain_rps,
                    domain_concurrency=settings.domain_concurrency,
                ),
                "stop": stop,
                "lease_clock": clock,
                "renew_every_seconds": 0.05,
            },
        )
        run.start()
        try:
            assert target.reached.wait(120), "the worker never fetched"
            proxy.set_mode("down")  # no renewal reaches PostgreSQL from here on
            assert not target.closed.is_set(), "the fetch ended while its lease was sure"
            # Past the doubt (0.8 of the lease since the last renewal sent), short of the end.
            clock.advance(settings.lease_seconds * 0.9)
            # Bounded only for the failing case (the fetch goes on for 300 s).
            assert target.closed.wait(60), "the cut-off worker fetched on into its lease's end"
            with db_engine.connect() as conn:
                lease_ends = conn.execute(
                    text(
                        "SELECT extract(epoch FROM lease_expires_at) FROM scraping.jobs"
                        " WHERE id = :id"
                    ),
                    {"id": job_id},
                ).scalar_one()
            assert target.closed_at is not None and target.closed_at < float(lease_ends), (
                "the cut-off worker was still fetching when its lease ended"
            )
        finally:
            stop.set()
            proxy.set_mode("pass")
            run.join(timeout=60)
            fetcher.close()
            engine.dispose()
            target.stop()
    assert not run.is_alive()


def test_a_target_flipping_between_two_hosts_leaves_no_connection_held(
    db_engine: Engine, make_tenant: Any, work: Worker
) -> None:
    """Hops back and forth between two hosts (the job's and another) end in
    too_many_redirects; every hop to the other host held a connection of it, and none is
    left held once the fetch is over (a leak would count against that host until the row
    lapsed, for every tenant)."""
    tenant = make_tenant("flip")[0]
    with HostilePeer(alias="127.0.0.2") as peer:
        job_id = enqueue(db_engine, tenant.id, peer.url("redirect-host-flip", "f"))
        work(allowed="127.0.0.1/32,127.0.0.2/32")
        hops = [r for r in peer.seen() if r.name == "f"]
    job, rows = job_and_attempts(db_engine, job_id)
    assert (job.status, job.last_error_class) == ("failed", "too_many_redirects")
    assert len(rows) == 1
    assert len(hops) == FetchPolicy().max_redirects + 1
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.redirect_slots")).scalar() == 0


class _WarmDripTarget(_DripTarget):
    """A _DripTarget that first answers its robots.txt (404: everything allowed) and a
    quick /warm page, each on a connection of its own, then drips to the next request."""

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            request = conn.recv(65536)
            if request.startswith((b"GET /robots.txt ", b"GET /warm ")):
                status = (
                    b"404 Not Found" if b"/robots.txt" in request.split(b"\r\n")[0] else b"200 OK"
                )
                with conn:
                    conn.sendall(
                        b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n"
                        b"Connection: close\r\n\r\nok"
                    )
                continue
            with conn:
                self.reached.set()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                while not self._stopping.is_set():
                    readable, _, _ = select.select([conn], [], [], 0.05)
                    if readable and conn.recv(1, socket.MSG_PEEK) == b"":
                        break
                    try:
                        conn.sendall(b"x")
                    except OSError:
                        break
                self.closed_at = time.time()
                self.closed.set()
            return


def test_a_lease_is_doubted_from_when_its_claim_was_sent_not_when_the_answer_came(
    db_url: str,
    db_engine: Engine,
    make_tenant: Any,
    local_store: LocalResultStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lease runs from the claim's moment in PostgreSQL; the worker counted it from
    when the claim's answer reached it. A claim answered late (a slow round trip, a stalled
    process) and a database cut right after: the worker believed in a lease that had
    already mostly run, and fetched on past its end (and beside the job's next owner).

    The host's robots.txt is read by a first job, before the cut, and the worker trusts
    what it read for the test's length: the job watched needs nothing of the database
    before its fetch (a robots.txt unknown with the database cut ends the attempt before
    any fetch, which is tests/scraping/test_robots.py's matter).

    The lease's time passes on the run's lease clock, which the test moves: half the lease
    while the claim's answer is held, four tenths more once the fetch is under way (nine
    tenths since the claim was sent, half less since its answer came)."""
    monkeypatch.setattr(robots_rows, "MEMO_SECONDS", 600.0)
    settings = dataclasses.replace(
        _with_allowed(TEST_SETTINGS, "127.0.0.1/32"),
        lease_seconds=120,
        fetch_timeout_seconds=300,
        max_result_bytes=1_000_000,
    )
    clock = LeaseClock()
    tenant = make_tenant("late-claim")[0]
    target = _WarmDripTarget()
    warm_id = enqueue(db_engine, tenant.id, f"{target.url}/warm")
    job_id = enqueue(db_engine, tenant.id, f"{target.url}/slow")
    stop = threading.Event()
    answer_arrives = threading.Event()
    claimed = threading.Event()

    def late_claim(engine: Engine, **kwargs: Any) -> list[leases.ClaimedJob]:
        jobs = claim_due_jobs(engine, **kwargs)
        if any(j.id == job_id for j in jobs):
            claimed.set()
            answer_arrives.wait(120)  # the answer's way back: held by the test
        return jobs

    with proxy_in_front_of(db_url) as proxy:
        engine = create_engine(database_url_via(db_url, proxy), poolclass=NullPool)
        fetcher = Fetcher(fetch_policy_from(settings))
        run = threading.Thread(
            target=run_worker,
            args=(engine, local_store, fetcher, retry_policy_from(settings)),
            kwargs={
                "options": WorkerOptions(
                    slots=1,
                    lease_seconds=settings.lease_seconds,
                    idle_exit_seconds=60,
                    max_run_duration_seconds=60,
                    poll_seconds=0.05,
                    domain_rps=settings.domain_rps,
                    domain_concurrency=settings.domain_concurrency,
                ),
                "stop": stop,
                "claim": late_claim,
                "lease_clock": clock,
                "renew_every_seconds": 0.05,
            },
        )
        run.start()
        try:
            assert claimed.wait(120), "the worker never claimed"
            warm, _ = job_and_attempts(db_engine, warm_id)
            assert warm.status == "succeeded"  # the robots.txt is known to the worker
            with db_engine.connect() as conn:
                lease_ends = float(
                    conn.execute(
                        text(
                            "SELECT extract(epoch FROM lease_expires_at) FROM scraping.jobs"
                            " WHERE id = :id"
                        ),
                        {"id": job_id},
                    ).scalar_one()
                )
            # Half the lease gone before the answer arrives.
            clock.advance(settings.lease_seconds * 0.5)
            proxy.set_mode("down")  # and no renewal reaches PostgreSQL after it
            answer_arrives.set()
            assert target.reached.wait(120), "the job's fetch never reached the target"
            assert not target.closed.is_set(), "the fetch ended while its lease was sure"
            # 0.9 of the lease since the claim was sent: in doubt; 0.4 since its answer.
            clock.advance(settings.lease_seconds * 0.4)
            # Bounded for the failing case (the fetch goes on for 300 s).
            assert target.closed.wait(60), "the worker fetched on into its lease's end"
            assert target.closed_at is not None and target.closed_at < lease_ends, (
                "the worker was still fetching when its lease ended"
            )
        finally:
            answer_arrives.set()
            stop.set()
            proxy.set_mode("pass")
            run.join(timeout=60)
            fetcher.close()
            engine.dispose()
            target.stop()
    assert not run.is_alive()


class _GatedAnswer:
    """One request on 127.0.0.2 (another host than the job's), answered with a small 200
    once `release` is set."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.2", 0))
        self.url = f"http://127.0.0.2:{self.listener.getsockname()[1]}"
        self.requests = 0
        self.reached = threading.Event()
        self.release = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.release.is_set() or self.requests == 0:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.recv(65536)
                self.requests += 1
                self.reached.set()
                self.release.wait(120)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        # Later requests (a fetch again) are counted too.
        with contextlib.suppress(OSError):
            self.listener.settimeout(2)
            conn, _ = self.listener.accept()
            with conn:
                conn.recv(65536)
                self.requests += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    def stop(self) -> None:
        self.release.set()
        self._thread.join(timeout=10)
        self.listener.close()


def test_a_redirect_slot_not_given_back_does_not_throw_away_the_answer(
    db_url: str,
    db_engine: Engine,
    make_tenant: Any,
    site: ScrapingTarget,
    local_store: LocalResultStore,
) -> None:
    """A hop to another host holds a connection of it; giving it back is a database call
    at the fetch's end. With the database cut at that moment the give-back raised out of
    the fetch, the answer in hand was dropped, and the attempt became a worker_error: the
    page was fetched again. The slot lapses by itself (its row expires with the fetch's
    deadline); the answer is the attempt's result."""
    settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32,127.0.0.2/32")
    settings = dataclasses.replace(settings, lease_seconds=30)
    tenant = make_tenant("give-back")[0]
    other_host = _GatedAnswer()
    job_id = enqueue(db_engine, tenant.id, f"{site.url}/redirect?to={other_host.url}/page")
    gate = LogSeen("failed unexpectedly", "not given back")
    logging.getLogger("pin_orchestration").addHandler(gate)
    stop = threading.Event()
    try:
        with proxy_in_front_of(db_url) as proxy:
            engine = create_engine(database_url_via(db_url, proxy), poolclass=NullPool)
            fetcher = Fetcher(fetch_policy_from(settings))
            run = threading.Thread(
                target=run_worker,
                args=(engine, local_store, fetcher, retry_policy_from(settings)),
                kwargs={
                    "options": WorkerOptions(
                        # Leases and slots while the database is cut: what a robots.txt lookup
                        # needs of the database is tested in tests/scraping/test_robots.py.
                        robots="ignore",
                        slots=1,
                        lease_seconds=settings.lease_seconds,
                        idle_exit_seconds=1.0,
                        max_run_duration_seconds=60,
                        poll_seconds=0.05,
                        domain_rps=settings.domain_rps,
                        domain_concurrency=settings.domain_concurrency,
                    ),
                    "stop": stop,
                },
            )
            run.start()
            try:
                assert other_host.reached.wait(120), "the hop never reached the other host"
                proxy.set_mode("down")
                other_host.release.set()
                assert gate.seen.wait(120), "the fetch's end was never logged"
                proxy.set_mode("pass")
                run.join(timeout=60)
            finally:
                stop.set()
                proxy.set_mode("pass")
                run.join(timeout=60)
                fetcher.close()
                engine.dispose()
    finally:
        logging.getLogger("pin_orchestration").removeHandler(gate)
        other_host.stop()
    assert not run.is_alive()
    job, rows = job_and_attempts(db_engine, job_id)
    assert other_host.requests == 1
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert [a.outcome for a in rows] == ["succeeded"]
