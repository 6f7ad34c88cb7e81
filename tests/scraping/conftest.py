"""Fixtures of the scraping tests: tenants, the local results store, the API app, the demo
target site on loopback, and a worker run with test-sized timings."""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store.leases import DomainDefaults
from pin_orchestration.scraping.store.local import LocalResultStore, load_or_create_signing_key
from pin_orchestration.scraping.store.results import ResultStore, S3ResultStore, s3_client
from pin_orchestration.scraping.store.tenancy import Tenant, create_tenant


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Schemathesis names each operation's item `test[POST /jobs]`, but pytest 9.2 builds
    the node id from its `originalname`, so all of a schema's items share one id; xdist
    schedules by node id and ran only the first. Each gets the id its name says."""
    from schemathesis.pytest.plugin import SchemathesisFunction

    for item in items:
        if isinstance(item, SchemathesisFunction) and item.nodeid.split("::")[-1] != item.name:
            item._id = item.parent.id.child(item.name)  # noqa: SLF001 — no public setter


# Starlette opens result files with anyio.open_file, which anyio imports lazily on first
# use — inside a worker thread, where pytest's assertion rewriter then parses the module
# and CPython 3.11 can fail with "AST constructor recursion depth mismatch" (gh-106905).
# Import it here, on the main thread.
anyio.open_file  # noqa: B018

# Politeness limits that never bind: for tests about something else.
UNLIMITED = DomainDefaults(rps=10_000.0, concurrency=10_000)

# Timings that keep the tests fast: retries back off by milliseconds (a target's
# Retry-After still holds). Leases and fetch timeouts are what a starved machine (a CPU hog
# beside the suite, a load of 18) cannot run out while a test is about something else: a
# worker whose renewal came 1.2 s late lost its lease of 1.5 s and left its job running.
# A test of expiry, renewal or a timeout sets its own, and orders its events with gates
# (`LeaseClock`, `renew_every_seconds`), never by waiting for the wall clock to run out.
TEST_SETTINGS = ScrapingSettings(
    slots=8,
    fetch_timeout_seconds=60,
    max_attempts=5,
    backoff_base_seconds=0.05,
    backoff_cap_seconds=0.2,
    lease_seconds=120,
    max_result_bytes=64 * 1024,
    api_public_url="http://testserver",
    # Politeness limits out of the way; the scheduling tests set their own.
    domain_rps=UNLIMITED.rps,
    domain_concurrency=UNLIMITED.concurrency,
    # An unreachable robots.txt is asked again within the test.
    robots_retry_seconds=0.2,
)


@pytest.fixture
def make_tenant(db_engine: Engine) -> Callable[[str], tuple[Tenant, str]]:
    return lambda name: create_tenant(db_engine, name)


@pytest.fixture
def local_store(tmp_path: Path) -> LocalResultStore:
    return LocalResultStore(
        tmp_path / "results",
        public_base_url=TEST_SETTINGS.api_public_url,
        signing_key=load_or_create_signing_key(tmp_path / "results-signing.key"),
    )


@pytest.fixture
def api_app(db_engine: Engine, local_store: LocalResultStore) -> FastAPI:
    return create_app(lambda: db_engine, local_store, TEST_SETTINGS)


@pytest.fixture
def client(api_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(api_app) as test_client:
        yield test_client


@contextmanager
def checkouts_and_commits(engine: Engine) -> Iterator[Counter[str]]:
    """Counts the pool checkouts and the commits `engine` makes inside the block."""
    seen: Counter[str] = Counter()

    def checkout(*_: object) -> None:
        seen["checkout"] += 1

    def commit(*_: object) -> None:
        seen["commit"] += 1

    event.listen(engine.pool, "checkout", checkout)
    event.listen(engine, "commit", commit)
    try:
        yield seen
    finally:
        event.remove(engine.pool, "checkout", checkout)
        event.remove(engine, "commit", commit)


def limited_client(
    db_engine: Engine, store: LocalResultStore, *, rps: float, burst: int
) -> TestClient:
    """A client of an API whose per-tenant intake limit is `rps` jobs a second, `burst` at
    once."""
    settings = dataclasses.replace(TEST_SETTINGS, intake_rps=rps, intake_burst=burst)
    return TestClient(create_app(lambda: db_engine, store, settings))


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def site() -> Iterator[ScrapingTarget]:
    demo = ScrapingTarget().start()
    yield demo
    demo.stop()


Worker = Callable[..., Any]


class LeaseClock:
    """A worker run's lease clock (`run_worker(lease_clock=…)`) that moves only when the
    test says: the run's leases are doubted when the test has moved it past most of their
    length, whatever the wall clock and the machine's load do meanwhile."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


@pytest.fixture
def work(db_engine: Engine, local_store: LocalResultStore) -> Worker:
    """Run a worker to idle with the test settings (allow-list: 127.0.0.1 only)."""
    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.policies import fetch_policy_from, retry_policy_from
    from pin_orchestration.scraping.worker.options import WorkerOptions
    from pin_orchestration.scraping.worker.run import run_worker

    def run(
        *,
        store: ResultStore | None = None,
        settings: ScrapingSettings = TEST_SETTINGS,
        idle_exit_seconds: float = 0.5,
        stop: threading.Event | None = None,
        allowed: str = "127.0.0.1/32",
        **run_kwargs: Any,
    ) -> Any:
        settings = _with_allowed(settings, allowed)
        fetcher = Fetcher(fetch_policy_from(settings))
        try:
            return run_worker(
                db_engine,
                store or local_store,
                fetcher,
                retry_policy_from(settings),
                WorkerOptions(
                    slots=settings.slots,
                    lease_seconds=settings.lease_seconds,
                    idle_exit_seconds=idle_exit_seconds,
                    # A bound only (pytest-timeout's is 300 s): a starved run takes long.
                    max_run_duration_seconds=240,
                    poll_seconds=0.05,
                    domain_rps=settings.domain_rps,
                    domain_concurrency=settings.domain_concurrency,
                    robots=settings.robots,
                    robots_retry_seconds=settings.robots_retry_seconds,
                ),
                stop=stop,
                rng=random.Random(7),
                **run_kwargs,
            )
        finally:
            fetcher.close()

    return run


def _with_allowed(settings: ScrapingSettings, allowed: str) -> ScrapingSettings:
    import dataclasses
    import ipaddress

    cidrs = tuple(ipaddress.ip_network(c) for c in allowed.split(",") if c)
    return dataclasses.replace(settings, allowed_cidrs=cidrs)


@pytest.fixture
def s3_store(s3_endpoint: str) -> S3ResultStore:
    client = s3_client(endpoint_url=s3_endpoint, region_name="us-east-1")
    bucket = f"results-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return S3ResultStore(client, bucket)


def free_loopback_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis of the session's own (`redis-server` on a free loopback port, nothing kept
    on disk) when the binary is installed — .ci/run installs it — else the machine's."""
    import shutil
    import subprocess
    import time

    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        # A database number of this session's own: the cache's flush drops job:* keys.
        yield f"redis://127.0.0.1:6379/{os.getpid() % 15 + 1}"
        return
    port = free_loopback_port()
    server = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"redis-server did not start on port {port}") from None
            time.sleep(0.02)
    client.close()
    try:
        yield url
    finally:
        server.terminate()
        server.wait(10)


def stored_objects(store: LocalResultStore, job_id: uuid.UUID) -> list[str]:
    """The keys of every object the local store holds for a job (each attempt's own)."""
    return sorted(
        str(p.relative_to(store.root))
        for p in store.root.rglob("*")
        if p.is_file() and str(job_id) in p.parts and not p.name.endswith(".meta.json")
    )
