"""The read cache of GET /jobs/{id} (SCR-14, seed step 19) against real PostgreSQL and a
real Redis: what is cached and for whom, how stale it can be, and that Redis failing
never fails a request."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.scraping.api import cache as cache_module
from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.api.cache import SHORT_TTL_SECONDS, JobCache, job_key
from pin_orchestration.scraping.store import leases, politeness, repository
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.repository import JobRequest
from tests.scraping.conftest import TEST_SETTINGS, auth, free_loopback_port

AppFactory = Callable[..., FastAPI]


@pytest.fixture
def cached_app(db_engine: Engine, local_store: LocalResultStore, redis_url: str) -> AppFactory:
    def make(url: str = redis_url, *, listen: bool = True) -> FastAPI:
        settings = dataclasses.replace(TEST_SETTINGS, redis_url=url)
        with pytest.MonkeyPatch.context() as patch:
            if url == redis_url:
                # The session's Redis answers a starved test late: its 50 ms timeout
                # would make hits misses. The dead and hung Redis keep the real one.
                patch.setattr(cache_module, "SOCKET_TIMEOUT_SECONDS", 5.0)
            return create_app(
                lambda: db_engine, local_store, settings, listen_for_invalidations=listen
            )

    return make


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def session_cache(redis_url: str) -> JobCache:
    """A cache on the session's Redis, whose answers a starved test gets late (see
    `cached_app`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_module, "SOCKET_TIMEOUT_SECONDS", 5.0)
        return JobCache.from_url(redis_url, retention_seconds=86400)


def cache_of(app: object) -> JobCache:
    return app.state.job_cache


@contextmanager
def live(app: FastAPI) -> Iterator[TestClient]:
    """A client of the app once its listener has connected (long TTLs on)."""
    with TestClient(app) as client:
        assert cache_of(app).invalidation_live.wait(60), "listener never connected"
        yield client


def submit(client: TestClient, key: str, url: str = "https://example.com/a") -> str:
    answer = client.post("/jobs", json={"url": url}, headers=auth(key))
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def wait_for_invalidations(cache: JobCache, count: int, timeout: float = 60.0) -> float:
    """Seconds until the listener has applied `count` finish events (`timeout` only ends a
    broken run)."""
    start = time.monotonic()
    while cache.stats().invalidations < count:
        assert time.monotonic() - start < timeout, cache.stats()
        time.sleep(0.005)
    return time.monotonic() - start


def finish(db_engine: Engine, job_id: str, status: str = "failed") -> None:
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET status = :status, finished_at = now(), "
                "last_error = 'target said no' WHERE id = :id"
            ),
            {"id": job_id, "status": status},
        )


def test_a_job_read_is_cached_under_its_tenant_and_lists_are_not(
    cached_app: AppFactory, make_tenant, db_engine: Engine, redis_client: redis.Redis
) -> None:
    tenant, key = make_tenant("shop")
    with live(cached_app()) as client:
        job_id = submit(client, key)
        first = client.get(f"/jobs/{job_id}", headers=auth(key))
        # A change no event announces (not a status change into or out of terminal).
        with db_engine.begin() as conn:
            conn.execute(
                text("UPDATE scraping.jobs SET attempts = 3 WHERE id = :id"), {"id": job_id}
            )
        second = client.get(f"/jobs/{job_id}", headers=auth(key))
        listed = client.get("/jobs", headers=auth(key)).json()["items"]

        assert first.status_code == second.status_code == 200
        assert second.content == first.content  # served from the cache: attempts still 0
        assert second.json()["attempts"] == 0
        assert [(j["id"], j["attempts"]) for j in listed] == [(job_id, 3)]  # the list is fresh
        epoch = cache_of(client.app).epoch  # type: ignore[arg-type]
        assert epoch is not None
        assert [k.decode() for k in redis_client.scan_iter(f"job:*:{tenant.id}:*")] == [
            job_key(epoch, tenant.id, uuid.UUID(job_id))
        ]
        stats = cache_of(client.app).stats()  # type: ignore[arg-type]
        assert (stats.hits, stats.misses) == (1, 1)
        # Not terminal: the short TTL.
        ttl = cache_of(client.app).ttl_seconds(tenant.id, uuid.UUID(job_id))  # type: ignore[arg-type]
        assert ttl is not None and 0 < ttl <= SHORT_TTL_SECONDS


def test_a_tenant_never_reads_another_tenants_cached_job(
    cached_app: AppFactory, make_tenant, redis_client: redis.Redis
) -> None:
    shop, shop_key = make_tenant("shop")
    crawler, crawler_key = make_tenant("crawler")
    with live(cached_app()) as client:
        job_id = submit(client, shop_key)
        assert client.get(f"/jobs/{job_id}", headers=auth(shop_key)).status_code == 200
        assert client.get(f"/jobs/{job_id}", headers=auth(shop_key)).status_code == 200  # hit
        for _ in range(2):
            answer = client.get(f"/jobs/{job_id}", headers=auth(crawler_key))
            assert answer.status_code == 404, answer.text
        epoch = cache_of(client.app).epoch  # type: ignore[arg-type]
        assert epoch is not None
        assert not redis_client.exists(job_key(epoch, crawler.id, uuid.UUID(job_id)))
        assert redis_client.exists(job_key(epoch, shop.id, uuid.UUID(job_id)))
        stats = cache_of(client.app).stats()  # type: ignore[arg-type]
        assert (stats.hits, stats.misses) == (1, 3)


def test_without_the_event_a_finished_job_reads_finished_within_the_short_ttl(
    cached_app: AppFactory, make_tenant, db_engine: Engine
) -> None:
    _, key = make_tenant("shop")
    with TestClient(cached_app(listen=False)) as client:
        job_id = submit(client, key)
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"
        cached_at = time.monotonic()
        finish(db_engine, job_id)
        # Nobody invalidates: the cached copy is what the client reads at first...
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"
        # ...and never longer than the short TTL after it was cached: timed at each read's
        # departure (the copy was cached before `cached_at`), not at its answer, which a
        # loaded machine may delay.
        while True:
            sent = time.monotonic()
            status = client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"]
            if status != "queued":
                break
            assert sent - cached_at < SHORT_TTL_SECONDS, "stale past the short TTL"
            time.sleep(0.05)
    assert status == "failed"


def test_the_finish_event_invalidates_at_once(cached_app: AppFactory, make_tenant) -> None:
    tenant, key = make_tenant("shop")
    with live(cached_app()) as client:
        cache = cache_of(client.app)
        # A queued job's copy lives 10 minutes here, not 2 s: however slowly a starved
        # test reads, only the event can have made the copy fresh.
        cache.short_ttl_seconds = 600
        job_id = submit(client, key)
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"
        assert cache.stats().hits == 1

        # The API's own cancel is a writer that knows nothing of the cache.
        assert client.post(f"/jobs/{job_id}/cancel", headers=auth(key)).status_code == 200
        wait_for_invalidations(cache, 1)
        view = client.get(f"/jobs/{job_id}", headers=auth(key)).json()
        # The row as the event left it replaced the event's tombstone: cached for long at
        # once (the terminal TTL, an hour).
        ttl = cache.ttl_seconds(tenant.id, uuid.UUID(job_id))

    assert view["status"] == "cancelled"
    assert ttl is not None and ttl > cache.short_ttl_seconds
    assert cache.stats().hits == 1


def test_a_terminal_job_stays_cached_for_the_terminal_ttl(
    cached_app: AppFactory, make_tenant
) -> None:
    tenant, key = make_tenant("shop")
    with live(cached_app()) as client:
        cache = cache_of(client.app)
        job_id = submit(client, key)
        assert client.post(f"/jobs/{job_id}/cancel", headers=auth(key)).status_code == 200
        wait_for_invalidations(cache, 1)
        first = client.get(f"/jobs/{job_id}", headers=auth(key))
        second = client.get(f"/jobs/{job_id}", headers=auth(key))
        # PIN_CACHE_TERMINAL_TTL_SECONDS (an hour by default), not the results' 30 days: the
        # cache's size stays bounded by an hour of finished jobs.
        ttl = cache.ttl_seconds(tenant.id, uuid.UUID(job_id))
    assert first.json()["status"] == "cancelled" and second.content == first.content
    assert cache.stats().hits == 1
    assert ttl is not None and 3590 < ttl <= 3600


def test_a_worker_finish_and_a_runbook_requeue_both_invalidate(
    cached_app: AppFactory, make_tenant, db_engine: Engine, site, work
) -> None:
    tenant, key = make_tenant("shop")
    with live(cached_app()) as client:
        cache = cache_of(client.app)
        job_id = submit(client, key, f"{site.url}/status/404")
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"
        work()
        wait_for_invalidations(cache, 1)
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "failed"
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "failed"
        hits = cache.stats().hits
        assert hits == 1

        # failed → queued again (runbook): the long-lived terminal copy must go.
        assert leases.requeue_failed_jobs(db_engine, [uuid.UUID(job_id)])
        wait_for_invalidations(cache, 2)
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"
        assert cache.stats().hits == hits


def test_a_fill_that_read_the_row_before_the_event_cannot_overwrite_it(
    redis_url: str,
) -> None:
    """The cache-aside race of seed step 19: read 'running', the job finishes and its event
    is applied, then the stale fill arrives. It must not land."""
    cache = session_cache(redis_url)
    tenant_id, job_id = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)
    read = cache.get(tenant_id, job_id)
    cache.invalidate(tenant_id, job_id, updated_at=now + timedelta(microseconds=1))
    body = b'{"status":"running"}'
    assert not cache.put(read, body, terminal=False, created_at=now, updated_at=now)
    assert cache.get(tenant_id, job_id).body is None
    # A fill with nothing in the way lands.
    other = uuid.uuid4()
    read = cache.get(tenant_id, other)
    assert cache.put(read, body, terminal=False, created_at=now, updated_at=now)
    assert cache.get(tenant_id, other).body == body


def test_copies_left_from_before_the_listener_connected_are_not_served(
    cached_app: AppFactory, make_tenant, redis_client: redis.Redis
) -> None:
    tenant, key = make_tenant("shop")
    with TestClient(cached_app(listen=False)) as client:
        job_id = submit(client, key)
        earlier_epoch = cache_of(client.app).epoch  # type: ignore[arg-type]
    assert earlier_epoch is not None
    # A copy some earlier process left, claiming a status the job never had.
    stale = b'{"status": "succeeded"}'
    key_left = job_key(earlier_epoch, tenant.id, uuid.UUID(job_id))
    redis_client.set(key_left, b"9" * 16 + b"\n" + stale, ex=86400)
    with live(cached_app()) as client:
        view = client.get(f"/jobs/{job_id}", headers=auth(key))
    assert view.json()["status"] == "queued" and view.content != stale


# --- Redis failing ----------------------------------------------------------------------


def exercise_every_read(client: TestClient, key: str) -> list[float]:
    """POST, GET (twice), list, attempts: all must answer; returns each call's seconds."""
    timings = []
    job_id = None
    for method, path in [
        ("POST", "/jobs"),
        ("GET", "/jobs/{id}"),
        ("GET", "/jobs/{id}"),
        ("GET", "/jobs"),
        ("GET", "/jobs/{id}/attempts"),
    ]:
        start = time.monotonic()
        if method == "POST":
            answer = client.post("/jobs", json={"url": "https://example.com/"}, headers=auth(key))
            job_id = answer.json()["id"]
        else:
            answer = client.get(path.format(id=job_id), headers=auth(key))
        timings.append(time.monotonic() - start)
        assert answer.status_code in (200, 202), (path, answer.text)
    return timings


def test_a_redis_that_refuses_connections_fails_no_request(
    cached_app: AppFactory, make_tenant
) -> None:
    _, key = make_tenant("shop")
    closed = f"redis://127.0.0.1:{free_loopback_port()}/0"
    with TestClient(cached_app(closed)) as client:
        for _ in range(3):
            exercise_every_read(client, key)
        stats = cache_of(client.app).stats()  # type: ignore[arg-type]
    assert stats.hits == 0 and stats.misses == 6 and stats.errors >= 1


@contextmanager
def black_hole() -> Iterator[str]:
    """A port that accepts connections and never answers (a hung Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    try:
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    finally:
        server.close()


def test_a_hung_redis_costs_one_short_timeout_not_one_per_request(
    cached_app: AppFactory, make_tenant
) -> None:
    """Every request answers; Redis is asked once (one socket timeout), then skipped. The
    breaker's window is the test's length here (a second by default, which a starved
    test's 25 requests outlast, each then paying a timeout again); the timeout is short and
    never retried: what a request can pay for Redis, told by the client's own settings,
    not by a wall clock a starved machine stretches."""
    _, key = make_tenant("shop")
    with black_hole() as url, TestClient(cached_app(url, listen=False)) as client:
        cache = cache_of(client.app)
        cache._breaker_seconds = 3600
        for _ in range(5):
            exercise_every_read(client, key)
        stats = cache.stats()
        connection = cache._redis.connection_pool.connection_kwargs
    assert connection["socket_timeout"] == connection["socket_connect_timeout"] <= 0.05
    assert connection["retry"].get_retries() == 0
    # The first read's get and its fill, then nothing: not one (or two) per request.
    assert 1 <= stats.errors <= 2, stats
    assert stats.misses == 10


class Forwarder:
    """A loopback TCP forwarder in front of Redis that can be killed: Redis "dies" with the
    API's pooled connections open."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        for s in self.sockets:
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def test_redis_dying_mid_traffic_fails_no_request(
    cached_app: AppFactory, make_tenant, redis_url: str
) -> None:
    _, key = make_tenant("shop")
    target = urlsplit(redis_url)
    forwarder = Forwarder(target.port or 6379)
    url = target._replace(netloc=f"127.0.0.1:{forwarder.port}").geturl()
    with live(cached_app(url)) as client:
        job_id = submit(client, key)
        for _ in range(3):
            assert client.get(f"/jobs/{job_id}", headers=auth(key)).status_code == 200
        assert cache_of(client.app).stats().hits == 2  # type: ignore[arg-type]

        forwarder.kill()
        for _ in range(3):
            exercise_every_read(client, key)
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["id"] == job_id
        stats = cache_of(client.app).stats()  # type: ignore[arg-type]
    assert stats.errors >= 1 and stats.hits == 2


# --- epochs and versions (issue 16, item 9) ---------------------------------------------


def test_another_api_process_starting_keeps_this_processes_copies(
    cached_app: AppFactory, make_tenant
) -> None:
    """A rolling restart: API process B (re)connects its listener while A serves. B may have
    missed events, A has not: A's copies stay hits."""
    _, key = make_tenant("shop")
    with live(cached_app()) as serving:
        job_id = submit(serving, key)
        assert serving.get(f"/jobs/{job_id}", headers=auth(key)).status_code == 200
        with live(cached_app()):
            pass
        assert serving.get(f"/jobs/{job_id}", headers=auth(key)).status_code == 200
        stats = cache_of(serving.app).stats()  # type: ignore[arg-type]
    assert (stats.hits, stats.misses) == (1, 1)


def test_a_listener_reconnect_serves_none_of_the_copies_made_before_it(
    cached_app: AppFactory, make_tenant, db_engine: Engine
) -> None:
    _, key = make_tenant("shop")
    with live(cached_app()) as client:
        cache = cache_of(client.app)
        job_id = submit(client, key)
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["attempts"] == 0
        before = cache.epoch
        # A change whose event the listener could have missed while it was cut off.
        with db_engine.begin() as conn:
            conn.execute(
                text("UPDATE scraping.jobs SET attempts = 3 WHERE id = :id"), {"id": job_id}
            )
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            )
        deadline = time.monotonic() + 60  # a bound for a broken run only
        while cache.epoch in (before, None):
            assert time.monotonic() < deadline, "listener never reconnected"
            time.sleep(0.01)
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["attempts"] == 3


def test_a_reader_stalled_across_a_requeue_does_not_store_the_stale_failed_copy(
    cached_app: AppFactory, make_tenant, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader reads `failed`, stalls; the runbook requeues, the event's tombstone comes
    and expires; then the reader's fill arrives. It must not land (for an hour)."""
    tenant, key = make_tenant("shop")
    with live(cached_app()) as client:
        cache = cache_of(client.app)
        cache.tombstone_ttl_seconds = 0.2  # its hour, shortened to keep this cheap
        job_id = submit(client, key)
        finish(db_engine, job_id, "failed")
        wait_for_invalidations(cache, 1)

        read_done, proceed = threading.Event(), threading.Event()
        real_get_job = repository.get_job

        def stalling_get_job(*args: object, **kwargs: object) -> object:
            row = real_get_job(*args, **kwargs)  # type: ignore[arg-type]
            if not proceed.is_set():
                read_done.set()
                assert proceed.wait(60)
            return row

        monkeypatch.setattr(repository, "get_job", stalling_get_job)
        stalled: list[str] = []
        reader = threading.Thread(
            target=lambda: stalled.append(
                client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"]
            )
        )
        reader.start()
        assert read_done.wait(60)
        assert leases.requeue_failed_jobs(db_engine, [uuid.UUID(job_id)])
        wait_for_invalidations(cache, 2)
        deadline = time.monotonic() + 60  # a bound for a broken run only
        while cache.ttl_seconds(tenant.id, uuid.UUID(job_id)) is not None:
            assert time.monotonic() < deadline, "the tombstone never expired"
            time.sleep(0.01)
        proceed.set()
        reader.join(60)
        assert stalled == ["failed"]  # what it read is what it answers...
        # ...but not what the next reader gets.
        assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["status"] == "queued"


def test_a_fill_never_replaces_a_newer_state_and_a_fresh_one_replaces_a_tombstone(
    redis_url: str,
) -> None:
    cache = session_cache(redis_url)
    tenant_id, job_id = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)
    v1, v2, v3 = (now + timedelta(microseconds=n) for n in (1, 2, 3))

    def fill(body: bytes, updated_at: datetime, read: object) -> bool:
        return cache.put(read, body, terminal=False, created_at=now, updated_at=updated_at)  # type: ignore[arg-type]

    stale_read, fresh_read = cache.get(tenant_id, job_id), cache.get(tenant_id, job_id)
    assert stale_read.body is None and fresh_read.body is None
    assert fill(b'{"status":"queued"}', v2, fresh_read)
    assert not fill(b'{"status":"failed"}', v1, stale_read)  # read before, stored after
    assert cache.get(tenant_id, job_id).body == b'{"status":"queued"}'
    assert fill(b'{"status":"running"}', v3, cache.get(tenant_id, job_id))  # newer: replaces

    cache.invalidate(tenant_id, job_id, updated_at=v3 + timedelta(microseconds=1))
    assert cache.get(tenant_id, job_id).body is None
    assert not fill(b'{"status":"running"}', v3, cache.get(tenant_id, job_id))
    # The row as the event left it may be cached at once: no 2 s of misses per finish.
    finished = v3 + timedelta(microseconds=1)
    assert fill(b'{"status":"failed"}', finished, cache.get(tenant_id, job_id))
    assert cache.get(tenant_id, job_id).body == b'{"status":"failed"}'


def test_a_status_change_by_a_transaction_begun_earlier_still_advances_updated_at(
    make_tenant, db_engine: Engine
) -> None:
    """A writer's now() is its transaction's start: one that began before another write
    committed (say it waited for that write's row lock) would set an older updated_at, and
    its event would look older than the copy it invalidates. Separate connections; the
    order of their statements is the gate."""
    tenant, _ = make_tenant("shop")
    request = JobRequest(url="http://127.0.0.1:9/x", params={})
    job_id = repository.submit_job(db_engine, tenant.id, request, None).id
    with db_engine.connect() as late, db_engine.connect() as listener:
        listener.execute(text("LISTEN scraping_job_finished"))
        listener.commit()
        late.execute(text("SELECT now()"))  # its transaction (and its now()) starts here
        with db_engine.begin() as conn:  # committed after `late` began
            first = conn.execute(
                text(
                    "UPDATE scraping.jobs SET status = 'failed', finished_at = now(), "
                    "updated_at = now() WHERE id = :id RETURNING updated_at"
                ),
                {"id": job_id},
            ).scalar_one()
        later = late.execute(
            text(
                "UPDATE scraping.jobs SET status = 'queued', finished_at = NULL, "
                "updated_at = now() WHERE id = :id RETURNING updated_at"
            ),
            {"id": job_id},
        ).scalar_one()
        late.commit()
        raw = listener.connection.driver_connection  # type: ignore[union-attr]
        events = [json.loads(n.payload) for n in raw.notifies(timeout=30, stop_after=2)]
    assert later > first
    assert [datetime.fromisoformat(e["updated_at"]) for e in events] == [first, later]


def test_a_queued_jobs_cached_wait_never_outlives_its_until(
    cached_app: AppFactory, make_tenant, db_engine: Engine
) -> None:
    """The copy of a job waiting for a pause lives at most until the pause ends, not the
    short TTL: a cached wait is never one that has lifted. The short TTL is 10 minutes
    here and the pause 5 (a pause of 0.8 s under the 2 s TTL had ended before a starved
    test's read); the copy's own TTL is what tells."""

    tenant, key = make_tenant("shop")
    with live(cached_app()) as client:
        cache = cache_of(client.app)
        cache.short_ttl_seconds = 600
        job_id = submit(client, key, "http://127.0.0.2/a")
        until = politeness.pause_domain(db_engine, "127.0.0.2", seconds=300, max_pause_seconds=3600)
        wait = client.get(f"/jobs/{job_id}", headers=auth(key)).json()["wait"]
        assert (wait["reason"], wait["cause"]) == ("host_paused", "operator")
        # `left` is read first: read after the TTL, a descheduled test saw it shrink past
        # the TTL it had just read (CI under load: 0.648 s left, 0.659 s of TTL).
        left = (until - datetime.now(UTC)).total_seconds()
        ttl = cache.ttl_seconds(tenant.id, uuid.UUID(job_id))
        assert ttl is not None and 0 < ttl <= left + 0.01 < cache.short_ttl_seconds
