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

from pin_orchestration.scraping.store import leases, politeness, repository
from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.conftest import TEST_SETTINGS
from tests.scraping.test_worker import attempts, enqueue, job_row


class GatedTarget:
    """Request number n (from 1) waits for `release(n)`, then answers 200 `answer n`
    (/robots.txt: 404 at once, not numbered)."""

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
                if self.path == "/robots.txt":  # none: everything allowed, not counted
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with target._arrived:
                    target.arrivals += 1
                    n = target.arrivals
                    gate = target._gate(n)
                    target._arrived.notify_all()
                gate.wait(120)  # a bound for a broken run only
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

    def wait_for_arrival(self, n: int, timeout: float = 120) -> None:
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
    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.policies import fetch_policy_from, retry_policy_from
    from pin_orchestration.scraping.worker.options import WorkerOptions
    from pin_orchestration.scraping.worker.run import run_worker
    from tests.scraping.conftest import _with_allowed

    tenant_id = make_tenant("shop")[0].id
    job_id = enqueue(db_engine, tenant_id, f"{gated.url}/x")
    settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
    stop = threading.Event()
    reports: list[Any] = []
    fetcher = Fetcher(fetch_policy_from(settings))
    # A lease no starvation runs out, renewed as often as a short one (every 0.05 s).
    options = WorkerOptions(
        slots=4,
        lease_seconds=120,
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
                renew_every_seconds=0.05,
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
        # forward twice. The timer only ends a failing run (renewals come every 0.05 s).
        seen = [_lease_expires_at(db_engine, job_id)]
        deadline = threading.Event()
        timer = threading.Timer(60, deadline.set)
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


def _blocked_for(engine: Engine, domain: str) -> float | None:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT extract(epoch FROM blocked_until - now()) FROM scraping.domains "
                "WHERE domain = :d"
            ),
            {"d": domain},
        ).scalar_one_or_none()


def test_a_pause_written_late_never_lifts_a_longer_one(db_engine: Engine, make_tenant: Any) -> None:
    from datetime import UTC, datetime, timedelta

    from pin_orchestration.scraping.worker.run import claim_due_jobs
    from tests.scraping.conftest import UNLIMITED

    tenant_id = make_tenant("shop")[0].id
    job_id = enqueue(db_engine, tenant_id, "http://paused.example/x")
    [job] = claim_due_jobs(
        db_engine, worker="w1", limit=1, lease_seconds=30, domain_defaults=UNLIMITED
    )
    # Another worker's 429 paused the domain for 600 s.
    politeness.pause_domain(db_engine, "paused.example", seconds=600, max_pause_seconds=3600)
    # This worker's outcome asked for a 2 s pause, and was held 10 s (a database blip)
    # before it could be written: its pause is over, and must not touch the 600 s one.
    decided = datetime.now(UTC)
    outcome = leases.AttemptOutcome(
        job_id=job.id,
        attempt=job.attempt,
        status="queued",
        outcome="retry",
        http_status=429,
        error_class="http_429",
        next_attempt_at=decided + timedelta(seconds=2),
        domain="paused.example",
        domain_paused_until=decided + timedelta(seconds=2),
    )
    written = leases.finish_attempts(
        db_engine,
        worker="w1",
        outcomes=[outcome],
        clock=lambda: decided + timedelta(seconds=10),
        max_pause_seconds=3600,
    )
    assert written == {job_id: "queued"}
    left = _blocked_for(db_engine, "paused.example")
    assert left is not None and left > 590
    # The function itself: a moment already past is no pause, and lifts nothing.
    with db_engine.begin() as conn:
        kept = conn.execute(
            text("SELECT scraping.pause_domain('paused.example', now() - interval '1 second')")
        ).scalar_one()
    assert kept is not None
    left = _blocked_for(db_engine, "paused.example")
    assert left is not None and left > 590
    # Only an operator's resume lifts it.
    assert politeness.resume_domain(db_engine, "paused.example") is True
    assert _blocked_for(db_engine, "paused.example") is None


def test_a_session_with_a_smaller_pause_cap_never_shortens_a_pause_in_force(
    db_engine: Engine,
) -> None:
    """The cap bounds the pause a session writes, not one already in force: a worker (or
    the operator's CLI) whose PIN_SCRAPING_MAX_PAUSE_SECONDS is 600 must not cut another's
    50-minute pause to 10 minutes."""
    politeness.pause_domain(db_engine, "capped.example", seconds=3000, max_pause_seconds=3600)
    with db_engine.begin() as conn:
        conn.execute(text("SELECT set_config('pin.scraping_max_pause_seconds', '600', true)"))
        conn.execute(
            text("SELECT scraping.pause_domain('capped.example', now() + interval '10 s')")
        )
    left = _blocked_for(db_engine, "capped.example")
    assert left is not None and left > 2990


def test_a_redirect_hop_to_the_jobs_own_host_spends_a_token_of_it(
    db_engine: Engine, make_tenant: Any
) -> None:
    from pin_orchestration.scraping.store.leases import DomainDefaults, RedirectSlots
    from pin_orchestration.scraping.worker.run import claim_due_jobs

    # One token per 100 s: the claim's is not back by the hop, however slow the machine.
    limits = DomainDefaults(rps=0.01, concurrency=10)
    tenant_id = make_tenant("shop")[0].id
    enqueue(db_engine, tenant_id, "http://one-rps.example/start")
    [job] = claim_due_jobs(
        db_engine, worker="w1", limit=1, lease_seconds=30, domain_defaults=limits
    )
    slots = RedirectSlots(db_engine, job, hold_seconds=5, domain_defaults=limits)
    # The claim spent the host's one token: a hop back to it waits for the next one.
    wait = slots.take("one-rps.example")
    assert 0 < wait <= 100
    # A pause of its own host holds the hop too.
    politeness.pause_domain(db_engine, "one-rps.example", seconds=600, max_pause_seconds=3600)
    assert slots.take("ONE-RPS.example") > 590
    slots.release()
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.redirect_slots")).scalar() == 0


class _Gate:
    """After its first outcome statement, each of two sessions waits until the other has
    made its first too, or is blocked on a lock (then the order is already decided)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.local = threading.local()
        self.first_done = {"A": threading.Event(), "B": threading.Event()}
        self.pids: dict[str, int] = {}

    def before(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        role = getattr(self.local, "role", None)
        if role is not None and role not in self.pids:
            self.pids[role] = cursor.connection.info.backend_pid

    def after(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        role = getattr(self.local, "role", None)
        if role is None or "UPDATE scraping.job_attempts" not in statement:
            return
        if self.first_done[role].is_set():
            return
        self.first_done[role].set()
        other = "B" if role == "A" else "A"
        with self.engine.connect() as watcher:
            # A bound for a broken run only: a starved session may take long to write.
            for _ in range(12000):
                if self.first_done[other].is_set():
                    return
                pid = self.pids.get(other)
                blocked = (
                    pid is not None
                    and watcher.execute(
                        text(
                            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :p"
                        ),
                        {"p": pid},
                    ).scalar_one_or_none()
                )
                watcher.rollback()
                if blocked:
                    return
                self.first_done[other].wait(0.01)
        raise AssertionError(f"session {other} neither wrote nor waited")


def _running_jobs_on(
    engine: Engine, make_tenant: Any, domains: list[str], per_domain: int
) -> dict[str, list[Any]]:
    """`per_domain` running jobs on each domain, and each domain's queue set aside for want
    of room (so a job leaving `running` updates the queue's row)."""
    from pin_orchestration.scraping.worker.run import claim_due_jobs
    from tests.scraping.conftest import UNLIMITED

    tenant_id = make_tenant("shop")[0].id
    for domain in domains:
        for n in range(per_domain):
            enqueue(engine, tenant_id, f"http://{domain}/{n}")
    claimed = claim_due_jobs(
        engine,
        worker="claimer",
        limit=len(domains) * per_domain,
        lease_seconds=60,
        domain_defaults=UNLIMITED,
    )
    assert len(claimed) == len(domains) * per_domain
    with engine.begin() as conn:
        for domain in domains:
            conn.execute(
                text(
                    "INSERT INTO scraping.domain_queues AS q "
                    "(domain, priority, head_tag, ready, waiting_for, wake_at) "
                    "VALUES (:d, 'normal', 0, false, 'room', now() + interval '1 hour') "
                    "ON CONFLICT (domain, priority) DO UPDATE SET ready = false, "
                    "waiting_for = 'room', wake_at = now() + interval '1 hour'"
                ),
                {"d": domain},
            )
    by_domain: dict[str, list[Any]] = {d: [] for d in domains}
    for job in sorted(claimed, key=lambda j: j.id):
        by_domain[job.domain].append(job)
    return by_domain


def _own(engine: Engine, job: Any, worker: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE scraping.jobs SET lease_owner = :w WHERE id = :id"),
            {"w": worker, "id": job.id},
        )


def _failed(job: Any) -> leases.AttemptOutcome:
    return leases.AttemptOutcome(
        job_id=job.id,
        attempt=job.attempt,
        status="failed",
        outcome="failed",
        http_status=404,
        error_class="http_404",
        job_domain=job.domain,
    )


def _two_gated_rounds(
    engine: Engine, rounds: dict[str, list[leases.AttemptOutcome]]
) -> dict[str, Any]:
    """Workers A and B write their outcome rounds at once, each on its own connection, the
    gate holding each after its first statement until the other has made its own: what
    each round wrote, or the first worker's error (a deadlock) raised."""
    from sqlalchemy import event

    from tests.chessboard.test_concurrency import Worker

    gate = _Gate(engine)
    event.listen(engine, "before_cursor_execute", gate.before)
    event.listen(engine, "after_cursor_execute", gate.after)
    written: dict[str, Any] = {}

    def finish(role: str) -> None:
        gate.local.role = role
        written[role] = leases.finish_attempts(engine, worker=role, outcomes=rounds[role])

    try:
        workers = [Worker(lambda role=role: finish(role)) for role in rounds]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
    finally:
        event.remove(engine, "before_cursor_execute", gate.before)
        event.remove(engine, "after_cursor_execute", gate.after)
    for worker in workers:
        if worker.error is not None:
            raise worker.error
    return written


def test_two_outcome_rounds_in_opposite_orders_do_not_deadlock(
    db_engine: Engine, make_tenant: Any
) -> None:

    jobs = _running_jobs_on(db_engine, make_tenant, ["x.example", "y.example"], 2)
    (xa, xb), (ya, yb) = jobs["x.example"], jobs["y.example"]
    for job, worker in ((xa, "A"), (ya, "A"), (xb, "B"), (yb, "B")):
        _own(db_engine, job, worker)
    # Completion order: A finished x then y, B finished y then x.
    written = _two_gated_rounds(
        db_engine, {"A": [_failed(xa), _failed(ya)], "B": [_failed(yb), _failed(xb)]}
    )
    assert written["A"] == {xa.id: "failed", ya.id: "failed"}
    assert written["B"] == {xb.id: "failed", yb.id: "failed"}


def _gated_against_a_round(
    db_engine: Engine,
    gate: _Gate,
    round_outcomes: list[leases.AttemptOutcome],
    other: Any,
) -> tuple[Any, Any]:
    """Session A writes `round_outcomes` (x, then y); session B runs `other` once A has
    written its first outcome. Returns both threads, finished."""
    from sqlalchemy import event

    from tests.chessboard.test_concurrency import Worker

    def finish() -> object:
        gate.local.role = "A"
        return leases.finish_attempts(db_engine, worker="A", outcomes=round_outcomes)

    def run_other() -> object:
        gate.local.role = "B"
        assert gate.first_done["A"].wait(120)
        try:
            return other()
        finally:
            gate.first_done["B"].set()

    event.listen(db_engine, "before_cursor_execute", gate.before)
    event.listen(db_engine, "after_cursor_execute", gate.after)
    try:
        a, b = Worker(finish), Worker(run_other)
        a.start()
        b.start()
        a.join(120)
        b.join(120)
    finally:
        event.remove(db_engine, "before_cursor_execute", gate.before)
        event.remove(db_engine, "after_cursor_execute", gate.after)
    return a, b


def test_the_sweeper_and_an_outcome_round_lock_domains_in_one_order(
    db_engine: Engine, make_tenant: Any
) -> None:
    jobs = _running_jobs_on(db_engine, make_tenant, ["x.example", "y.example"], 2)
    (xa, xs), (ya, ys) = jobs["x.example"], jobs["y.example"]
    _own(db_engine, xa, "A")
    _own(db_engine, ya, "A")
    with db_engine.begin() as conn:  # y's lease ran out first: the sweep meets y, then x
        for job, ago in ((ys, 20), (xs, 10)):
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET lease_expires_at = now() - make_interval("
                    "secs => :ago) WHERE id = :id"
                ),
                {"id": job.id, "ago": ago},
            )
    gate = _Gate(db_engine)
    a, b = _gated_against_a_round(
        db_engine,
        gate,
        [_failed(xa), _failed(ya)],
        lambda: leases.sweep_expired_leases(db_engine, max_attempts=5),
    )
    for worker in (a, b):
        if worker.error is not None:
            raise worker.error
    assert a.result == {xa.id: "failed", ya.id: "failed"}
    assert sorted(r.id for r in b.result) == sorted([xs.id, ys.id])


def test_the_requeue_runbook_and_an_outcome_round_lock_domains_in_one_order(
    db_engine: Engine, make_tenant: Any
) -> None:
    # y's jobs are stored first: the requeue's update meets y, then x.
    jobs = _running_jobs_on(db_engine, make_tenant, ["y.example", "x.example"], 2)
    (xa, xf), (ya, yf) = jobs["x.example"], jobs["y.example"]
    _own(db_engine, xa, "A")
    _own(db_engine, ya, "A")
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET status = 'failed', lease_owner = NULL, "
                "lease_expires_at = NULL, finished_at = now() WHERE id IN (:x, :y)"
            ),
            {"x": xf.id, "y": yf.id},
        )
        # Queues whose head sorts after any requeued job: the requeue rewrites their rows.
        conn.execute(text("UPDATE scraping.domain_queues SET head_tag = 1e18"))
    gate = _Gate(db_engine)
    a, b = _gated_against_a_round(
        db_engine,
        gate,
        [_failed(xa), _failed(ya)],
        lambda: leases.requeue_failed_jobs(db_engine, [yf.id, xf.id]),
    )
    for worker in (a, b):
        if worker.error is not None:
            raise worker.error
    assert a.result == {xa.id: "failed", ya.id: "failed"}
    assert sorted(b.result) == sorted([xf.id, yf.id])


def _retry(job: Any) -> leases.AttemptOutcome:
    return leases.AttemptOutcome(
        job_id=job.id,
        attempt=job.attempt,
        status="queued",
        outcome="retry",
        http_status=503,
        error_class="http_503",
        job_domain=job.domain,
    )


def test_two_retry_rounds_crossing_tenants_do_not_deadlock(
    db_engine: Engine, make_tenant: Any
) -> None:
    """A retry takes its tenant's next fair tag (a lock on the tenant's row of its class)
    before its domain's queue: rounds whose domains come in one order but whose tenants
    cross must still queue, not deadlock."""

    from pin_orchestration.scraping.worker.run import claim_due_jobs
    from tests.scraping.conftest import UNLIMITED

    one, two = make_tenant("one")[0].id, make_tenant("two")[0].id
    for tenant, url in ((one, "http://x.example/1"), (two, "http://x.example/2")):
        enqueue(db_engine, tenant, url)
    for tenant, url in ((two, "http://y.example/1"), (one, "http://y.example/2")):
        enqueue(db_engine, tenant, url)
    claimed = claim_due_jobs(
        db_engine, worker="claimer", limit=4, lease_seconds=60, domain_defaults=UNLIMITED
    )
    by_url = {j.url: j for j in claimed}
    xa, ya = by_url["http://x.example/1"], by_url["http://y.example/1"]  # tenants one, two
    xb, yb = by_url["http://x.example/2"], by_url["http://y.example/2"]  # tenants two, one
    for job, worker in ((xa, "A"), (ya, "A"), (xb, "B"), (yb, "B")):
        _own(db_engine, job, worker)
    written = _two_gated_rounds(
        db_engine, {"A": [_retry(xa), _retry(ya)], "B": [_retry(xb), _retry(yb)]}
    )
    assert written["A"] == {xa.id: "queued", ya.id: "queued"}
    assert written["B"] == {xb.id: "queued", yb.id: "queued"}
