"""Worker runs against real PostgreSQL, a real HTTP target on loopback and real stores:
every lifecycle transition, the retry planner's decisions, SSRF refusal, leases."""

from __future__ import annotations

import gc
import hashlib
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.store import leases, repository
from pin_orchestration.scraping.store.leases import AttemptOutcome
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.worker.run import claim_due_jobs
from tests.scraping.conftest import TEST_SETTINGS, UNLIMITED, Worker


def enqueue(engine: Engine, tenant_id: uuid.UUID, url: str, **params: Any) -> uuid.UUID:
    return repository.submit_job(engine, tenant_id, JobRequest(url=url, params=params), None).id


def job_row(engine: Engine, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM scraping.jobs WHERE id = :id"), {"id": job_id}
        ).one()


def attempts(engine: Engine, job_id: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM scraping.job_attempts WHERE job_id = :id ORDER BY number"),
            {"id": job_id},
        ).all()


@pytest.fixture
def tenant_id(make_tenant) -> uuid.UUID:
    return make_tenant("shop")[0].id


def test_200_is_stored_then_succeeded(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, local_store: LocalResultStore
) -> None:
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/page/home", lang="en")
    report = work()
    assert (report.claimed, report.succeeded) == (1, 1)
    row = job_row(db_engine, job_id)
    assert row.status == "succeeded" and row.attempts == 1
    assert row.finished_at is not None and row.lease_expires_at is None
    body = local_store.read_bytes(row.result_key)
    assert b"demo page /page/home" in body and b"lang=en" in body
    assert row.result_sha256 == hashlib.sha256(body).hexdigest()
    assert row.result_size == len(body)
    assert row.result_content_type == "text/html; charset=utf-8"
    day = row.created_at.astimezone(UTC)
    assert row.result_key == f"results/{tenant_id}/{day:%Y/%m/%d}/{job_id}/1"
    [attempt] = attempts(db_engine, job_id)
    assert (attempt.outcome, attempt.http_status) == ("succeeded", 200)


@pytest.mark.parametrize("status,error_class", [(404, "http_404"), (401, "http_401")])
def test_permanent_answers_fail_at_once(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, status: int, error_class: str
) -> None:
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/status/{status}")
    work()
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("failed", 1, error_class)
    assert row.last_error and row.result_key is None
    assert site.count(f"/status/{status}") == 1


def test_429_waits_for_retry_after(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker
) -> None:
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/status/429", retry_after=120)
    before = datetime.now(UTC)
    work()
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("queued", 1, "http_429")
    # the backoff policy alone would retry within 0.2 s; the target asked for 120 s
    assert row.next_attempt_at >= before + timedelta(seconds=119)
    [attempt] = attempts(db_engine, job_id)
    assert (attempt.outcome, attempt.http_status) == ("retry", 429)


@pytest.mark.parametrize("retry_after", ["0", None])
def test_a_429_with_retry_after_0_pauses_its_host_like_one_without(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, retry_after: str | None
) -> None:
    # `Retry-After: 0` asks for no wait: it is as if absent, so the 429 still pauses its
    # host for the floor (backoff_base_seconds) and the job waits behind it. It lifted the
    # floor: the host was not paused at all and the job went back within its jitter.
    import dataclasses

    settings = dataclasses.replace(TEST_SETTINGS, backoff_base_seconds=30, backoff_cap_seconds=30)
    params = {} if retry_after is None else {"retry_after": retry_after}
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/status/429", **params)
    work(settings=settings, idle_exit_seconds=0.5)
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("queued", 1, "http_429")
    assert site.count("/status/429") == 1
    with db_engine.connect() as conn:
        paused_for = conn.execute(
            text(
                "SELECT extract(epoch FROM blocked_until - now()) FROM scraping.domains"
                " WHERE domain = :domain"
            ),
            {"domain": row.domain},
        ).scalar_one()
    assert paused_for is not None and 20 <= paused_for <= 30


def test_a_stopped_worker_is_not_held_by_a_target_that_never_answers(
    db_engine: Engine, tenant_id, work: Worker
) -> None:
    """A target that takes the request and never answers held a stopping worker until
    the fetch timeout (300 s here). The stop now interrupts the wait for the headers: the
    run ends and hands the job back to the queue."""
    import dataclasses

    from tests.scraping.test_fetch import SilentTarget

    silent = SilentTarget()
    settings = dataclasses.replace(TEST_SETTINGS, fetch_timeout_seconds=300, robots="ignore")
    job_id = enqueue(db_engine, tenant_id, silent.url)
    stop = threading.Event()
    reports: list[Any] = []
    run = threading.Thread(
        target=lambda: reports.append(work(settings=settings, stop=stop, idle_exit_seconds=30))
    )
    try:
        run.start()
        assert silent.asked.wait(120)
        stop.set()
        run.join(timeout=120)  # a bound on failure only: the fetch timeout is 300 s
        assert not run.is_alive(), "the stopped worker waited for the target"
    finally:
        silent.close()
        run.join()
    row = job_row(db_engine, job_id)
    assert (row.status, row.last_error_class) == ("queued", "worker_stopped")


def test_503_twice_then_200_succeeds_on_the_third_attempt(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker
) -> None:
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/flaky/x", fail=2)
    work(idle_exit_seconds=2.5)  # Retry-After: 1 between attempts
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts) == ("succeeded", 3)
    assert [(a.outcome, a.http_status) for a in attempts(db_engine, job_id)] == [
        ("retry", 503),
        ("retry", 503),
        ("succeeded", 200),
    ]


def test_a_target_slower_than_the_timeout_is_retried_then_failed(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker
) -> None:
    import dataclasses

    settings = dataclasses.replace(TEST_SETTINGS, max_attempts=2, fetch_timeout_seconds=0.3)
    # A minute's wait for the answer: only the timeout can end the fetch, however late.
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/slow/s", ms=60000)
    work(settings=settings, idle_exit_seconds=1.0)
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("failed", 2, "timeout")
    assert [a.outcome for a in attempts(db_engine, job_id)] == ["retry", "failed"]


def test_a_body_over_the_limit_fails_and_stores_nothing(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, local_store: LocalResultStore
) -> None:
    too_big = TEST_SETTINGS.max_result_bytes + 1
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/slow/big", ms=0, bytes=too_big)
    work()
    row = job_row(db_engine, job_id)
    assert (row.status, row.last_error_class) == ("failed", "body_too_large")
    assert not list(local_store.root.rglob(str(job_id)))


def test_refused_addresses_are_never_contacted_directly_or_by_redirect(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker
) -> None:
    private = ScrapingTarget("127.0.0.2").start()  # counts every connection it accepts
    try:
        direct = enqueue(db_engine, tenant_id, f"{private.url}/secret")
        redirected = enqueue(db_engine, tenant_id, f"{site.url}/redirect", to=f"{private.url}/x")
        work(allowed="127.0.0.1/32")
        for job_id in (direct, redirected):
            row = job_row(db_engine, job_id)
            assert (row.status, row.last_error_class) == ("failed", "refused_address")
        assert private.accepted_connections == 0
        assert site.count("/redirect") == 1
    finally:
        private.stop()


def test_the_result_object_exists_before_the_job_reads_succeeded(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, local_store: LocalResultStore
) -> None:
    """A store that looks at the job while it writes: the job must still be running then,
    and a reader polling all along never sees succeeded without the object."""
    statuses_at_put: list[str] = []
    violations: list[str] = []
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/page/ordered")

    class WatchingStore:
        def __getattr__(self, name: str) -> Any:
            return getattr(local_store, name)

        def put(self, key: str, body: Any, **kw: Any) -> Any:
            statuses_at_put.append(job_row(db_engine, job_id).status)
            # The gate: the poller looks (a whole look begun after this point) while the
            # object is being written, however slowly the machine runs it.
            with looked:
                seen = polls[0]
                assert looked.wait_for(lambda: polls[0] >= seen + 2, timeout=60)
            return local_store.put(key, body, **kw)

    done = threading.Event()
    looked = threading.Condition()
    polls = [0]

    def poll() -> None:
        while not done.is_set():
            row = job_row(db_engine, job_id)
            if row.status == "succeeded" and local_store.head(row.result_key) is None:
                violations.append("succeeded without its object")
            with looked:
                polls[0] += 1
                looked.notify_all()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        work(store=WatchingStore())
    finally:
        done.set()
        poller.join()
    assert statuses_at_put == ["running"]
    assert not violations
    assert job_row(db_engine, job_id).status == "succeeded"


def test_a_run_keeps_the_heap_it_started_with_out_of_the_collectors_full_passes(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, local_store: LocalResultStore
) -> None:
    """What was alive when the run started (modules, Dagster's definitions) is frozen for the
    run: the collector's full passes walk only what the run allocates (over a worker's whole
    heap they were ~12% of its CPU, bench/scraping_workers.py under perf). Unfrozen when the
    run ends, so what became garbage meanwhile is collected then."""
    frozen_at_put: list[int] = []

    class WatchingStore:
        def __getattr__(self, name: str) -> Any:
            return getattr(local_store, name)

        def put(self, key: str, body: Any, **kw: Any) -> Any:
            frozen_at_put.append(gc.get_freeze_count())
            return local_store.put(key, body, **kw)

    enqueue(db_engine, tenant_id, f"{site.url}/page/frozen")
    assert gc.get_freeze_count() == 0
    assert work(store=WatchingStore()).succeeded == 1
    assert len(frozen_at_put) == 1 and frozen_at_put[0] > 0
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_before_the_run_is_still_frozen_after_it(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker
) -> None:
    """The process's own freeze (a server that froze its heap before forking) is not the
    run's to undo."""
    enqueue(db_engine, tenant_id, f"{site.url}/page/frozen-before")
    gc.freeze()
    try:
        assert work().succeeded == 1
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_running_job_is_cancelled_at_the_workers_next_check(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, local_store: LocalResultStore
) -> None:
    """The cancel comes back with the next lease renewal and stops the fetch in flight: the
    target never answers (its answer waits for a gate the test opens only at the end), so
    the run ends only if the cancel cut the fetch. The lease is long (a starved machine
    cannot lose it), its renewals come as often as a short lease's."""
    import dataclasses

    settings = dataclasses.replace(TEST_SETTINGS, fetch_timeout_seconds=300)
    job_id = enqueue(db_engine, tenant_id, f"{site.url}/held/c")
    result: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: result.update(r=work(settings=settings, renew_every_seconds=0.05))
    )
    worker.start()
    try:
        site.wait_for_requests(1, timeout=120)  # the fetch waits for the answer's headers
        assert repository.cancel_job(db_engine, tenant_id, job_id) == ("running", True)
        worker.join(timeout=120)  # a bound on failure only: the fetch timeout is 300 s
        assert not worker.is_alive(), "the cancel did not stop the fetch in flight"
    finally:
        site.gate.set()
        worker.join()
    row = job_row(db_engine, job_id)
    assert row.status == "cancelled" and row.finished_at is not None
    assert row.result_key is None and not list(local_store.root.rglob(str(job_id)))
    assert [a.outcome for a in attempts(db_engine, job_id)] == ["cancelled"]


def test_the_sweeper_deletes_lapsed_redirect_slots_and_keeps_live_ones(
    db_engine: Engine,
) -> None:
    """A worker killed during a hop leaves its redirect slot's row: it lapses (the claim
    no longer counts it) but nothing deleted it, so the table only grew. The lease sweeper
    deletes the lapsed rows; a hop still in its slot keeps it."""
    lapsed, live = uuid.uuid4(), uuid.uuid4()
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.redirect_slots (job_id, attempt, domain, expires_at)"
                " VALUES (:lapsed, 1, 'a.example', now() - interval '1 second'),"
                "        (:live, 1, 'a.example', now() + interval '1 hour')"
            ),
            {"lapsed": lapsed, "live": live},
        )
    assert leases.sweep_expired_leases(db_engine, max_attempts=5) == []
    with db_engine.connect() as conn:
        left = conn.execute(text("SELECT job_id FROM scraping.redirect_slots")).scalars().all()
    assert left == [live]


def test_a_late_worker_cannot_overwrite_a_swept_and_reclaimed_job(
    db_engine: Engine, tenant_id
) -> None:
    job_id = enqueue(db_engine, tenant_id, "http://127.0.0.1:9/x")
    [first] = claim_due_jobs(
        db_engine, worker="A", limit=5, lease_seconds=0.05, domain_defaults=UNLIMITED
    )
    time.sleep(0.1)
    swept = leases.sweep_expired_leases(db_engine, max_attempts=5)
    assert [(r.id, r.status) for r in swept] == [(job_id, "queued")]
    [second] = claim_due_jobs(
        db_engine, worker="B", limit=5, lease_seconds=30, domain_defaults=UNLIMITED
    )
    assert (first.attempt, second.attempt) == (1, 2)

    late = AttemptOutcome(
        job_id=job_id, attempt=1, status="failed", outcome="failed", error_class="http_404"
    )
    assert leases.finish_attempts(db_engine, worker="A", outcomes=[late]) == {}
    row = job_row(db_engine, job_id)
    assert (row.status, row.lease_owner, row.attempts) == ("running", "B", 2)
    assert [(a.number, a.outcome, a.error_class) for a in attempts(db_engine, job_id)] == [
        (1, "lost", "lease_expired"),
        (2, None, None),
    ]


def test_the_sweeper_fails_a_job_whose_attempts_are_spent_and_requeue_restores_it(
    db_engine: Engine, tenant_id
) -> None:
    job_id = enqueue(db_engine, tenant_id, "http://127.0.0.1:9/x")
    for _ in range(2):
        claim_due_jobs(
            db_engine, worker="A", limit=1, lease_seconds=0.01, domain_defaults=UNLIMITED
        )
        time.sleep(0.05)
        leases.sweep_expired_leases(db_engine, max_attempts=2)
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("failed", 2, "lease_expired")
    assert [j["id"] for j in leases.list_failed_jobs(db_engine)] == [job_id]
    assert leases.requeue_failed_jobs(db_engine, [job_id, uuid.uuid4()]) == [job_id]
    [again] = claim_due_jobs(
        db_engine, worker="B", limit=1, lease_seconds=30, domain_defaults=UNLIMITED
    )
    assert (again.attempt, again.budget_used) == (3, 1)


def test_two_workers_on_separate_connections_never_claim_the_same_job(
    db_engine: Engine, tenant_id
) -> None:
    ids = {enqueue(db_engine, tenant_id, f"http://127.0.0.1:9/{i}") for i in range(200)}
    barrier = threading.Barrier(4)
    claimed: dict[str, list[uuid.UUID]] = {}
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        try:
            barrier.wait()
            mine: list[uuid.UUID] = []
            while batch := claim_due_jobs(
                db_engine, worker=name, limit=7, lease_seconds=30, domain_defaults=UNLIMITED
            ):
                mine += [j.id for j in batch]
            claimed[name] = mine
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    everything = [j for mine in claimed.values() for j in mine]
    assert len(everything) == len(set(everything)) == 200
    assert set(everything) == ids
    assert all(claimed.values()), "each worker got a share"


def test_a_claim_is_one_statement_in_autocommit_without_begin_or_commit(
    db_engine: Engine, tenant_id
) -> None:
    """scraping.claim_jobs is one statement, atomic by itself: sent in a transaction of its
    own, its BEGIN and COMMIT were two more round trips of the worker's main loop, each
    waiting for the GIL behind hundreds of slot threads at a round's end, with the claim's
    row locks (the tenant's, the domain's) held until the COMMIT came."""
    ids = {enqueue(db_engine, tenant_id, f"http://127.0.0.1:9/{i}") for i in range(3)}
    seen: list[tuple[bool, str]] = []

    @event.listens_for(db_engine, "before_cursor_execute")
    def autocommit(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if "scraping.claim_jobs(" in statement:
            seen.append((conn.connection.dbapi_connection.autocommit, "execute"))

    @event.listens_for(db_engine, "commit")
    def committed(conn) -> None:  # type: ignore[no-untyped-def]
        if seen:
            seen.append((False, "commit"))

    try:
        jobs = claim_due_jobs(
            db_engine, worker="w", limit=5, lease_seconds=30, domain_defaults=UNLIMITED
        )
    finally:
        event.remove(db_engine, "before_cursor_execute", autocommit)
        event.remove(db_engine, "commit", committed)
    assert {j.id for j in jobs} == ids
    assert seen == [(True, "execute")]
    with db_engine.connect() as conn:
        running = conn.execute(
            text("SELECT count(*) FROM scraping.jobs WHERE status = 'running'")
        ).scalar()
    assert running == 3


def test_a_round_of_one_hosts_finished_jobs_is_written_in_one_statement_in_autocommit(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker
) -> None:
    """A round's outcomes of one host, none handed back and no host paused, are one
    statement (finish_attempts), atomic by itself: sent in autocommit, without the BEGIN
    and COMMIT round trips of the worker's main loop (bench/scraping_workers.py
    --timeline: a slot idle a median 50-280 ms between its fetch's end and its next
    claim, the loop's round trips each waiting for the GIL behind the slots)."""
    ids = [enqueue(db_engine, tenant_id, f"{site.url}/page/{n}") for n in range(4)]
    written: list[bool] = []

    @event.listens_for(db_engine, "before_cursor_execute")
    def autocommit(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if "UPDATE scraping.job_attempts" in statement:
            written.append(conn.connection.dbapi_connection.autocommit)

    try:
        report = work()
    finally:
        event.remove(db_engine, "before_cursor_execute", autocommit)
    assert report.succeeded == len(ids)
    assert written and all(written), written
    assert {job_row(db_engine, i).status for i in ids} == {"succeeded"}


def test_results_go_to_s3_and_the_presigned_url_returns_the_exact_bytes(
    db_engine: Engine, tenant_id, site: ScrapingTarget, work: Worker, s3_store
) -> None:
    import requests

    job_id = enqueue(db_engine, tenant_id, f"{site.url}/slow/s3", ms=0, bytes=5000)
    work(store=s3_store)
    row = job_row(db_engine, job_id)
    assert row.status == "succeeded"
    stored = s3_store.head(row.result_key)
    assert (stored.size, stored.sha256) == (5000, row.result_sha256)
    url, _ = s3_store.signed_url(row.result_key, ttl_seconds=60)
    download = requests.get(url, timeout=60)  # a plain HTTP GET, no AWS client
    assert download.status_code == 200
    assert download.content == b"x" * 5000
    assert download.headers["Content-Type"] == "application/octet-stream"


def test_retry_and_pause_times_follow_the_database_clock_whatever_the_workers_clock(
    db_engine: Engine, tenant_id
) -> None:
    """A worker decides "retry in 10 s" and "leave the domain alone for 30 s" with its own
    clock; the claim compares with PostgreSQL's now(). A worker host an hour ahead must not
    push its retries an hour late (nor one behind make them due at once)."""
    for skew in (timedelta(hours=1), timedelta(hours=-1)):
        job_id = enqueue(db_engine, tenant_id, "http://127.0.0.1:9/x")
        [job] = claim_due_jobs(
            db_engine, worker="A", limit=5, lease_seconds=30, domain_defaults=UNLIMITED
        )
        worker_now = datetime.now(UTC) + skew
        outcome = AttemptOutcome(
            job_id=job_id,
            attempt=job.attempt,
            status="queued",
            outcome="retry",
            error_class="http_429",
            next_attempt_at=worker_now + timedelta(seconds=10),
            domain=job.domain,
            domain_paused_until=worker_now + timedelta(seconds=30),
        )
        assert leases.finish_attempts(
            db_engine, worker="A", outcomes=[outcome], clock=lambda n=worker_now: n
        ) == {job_id: "queued"}
        with db_engine.connect() as conn:
            retry_in, paused_for = conn.execute(
                text(
                    "SELECT extract(epoch FROM j.next_attempt_at - now()),"
                    "       extract(epoch FROM d.blocked_until - now())"
                    " FROM scraping.jobs j JOIN scraping.domains d ON d.domain = j.domain"
                    " WHERE j.id = :id"
                ),
                {"id": job_id},
            ).one()
        assert 8 <= retry_in <= 10, skew
        assert 28 <= paused_for <= 30, skew
        with db_engine.begin() as conn:
            conn.execute(text("DELETE FROM scraping.jobs WHERE id = :id"), {"id": job_id})
            conn.execute(text("DELETE FROM scraping.domains"))
