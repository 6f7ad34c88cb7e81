"""The scraping metrics (SCR-12) read from PostgreSQL, as `pin metrics serve` and the API's
/metrics expose them, parsed back with prometheus_client's own parser."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection, Engine, text

from pin_orchestration.areas import metrics_registry
from pin_orchestration.platform.ids import uuid7
from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.conftest import TEST_SETTINGS, auth

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(exposition: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    }


def add_job(
    conn: Connection,
    tenant_id: uuid.UUID,
    *,
    url: str = "https://a.example/x",
    status: str = "queued",
    priority: str = "normal",
    created_ago: float = 0.0,
    started_after: float | None = None,
    due_in: float = 0.0,
    lease_in: float | None = None,
) -> uuid.UUID:
    job_id = uuid7()
    conn.execute(
        text(
            """
            INSERT INTO scraping.jobs (id, tenant_id, url, domain, status, priority,
                                       created_at, started_at, next_attempt_at, lease_owner,
                                       lease_expires_at, result_key)
            VALUES (:id, :tenant_id, :url, split_part(split_part(:url, '://', 2), '/', 1),
                    :status, :priority,
                    now() - make_interval(secs => :created_ago),
                    now() - make_interval(secs => :created_ago)
                          + make_interval(secs => CAST(:started_after AS float8)),
                    now() + make_interval(secs => :due_in),
                    CASE WHEN :status = 'running' THEN 'worker-1' END,
                    now() + make_interval(secs => CAST(:lease_in AS float8)),
                    CASE WHEN :status = 'succeeded' THEN 'results/x' END)
            """
        ),
        {
            "id": job_id,
            "tenant_id": tenant_id,
            "url": url,
            "status": status,
            "priority": priority,
            "created_ago": created_ago,
            "started_after": started_after,
            "due_in": due_in,
            "lease_in": lease_in,
        },
    )
    return job_id


def add_attempt(
    conn: Connection,
    job_id: uuid.UUID,
    number: int,
    outcome: str | None,
    error_class: str | None = None,
    started_ago: float = 1.0,
    finished_ago: float = 0.0,
) -> None:
    conn.execute(
        text(
            """
            INSERT INTO scraping.job_attempts (job_id, number, worker, started_at, finished_at,
                                               outcome, error_class)
            VALUES (:job_id, :number, 'worker-1', now() - make_interval(secs => :ago),
                    CASE WHEN CAST(:outcome AS text) IS NOT NULL
                         THEN now() - make_interval(secs => :finished_ago) END,
                    :outcome, :error_class)
            """
        ),
        {
            "job_id": job_id,
            "number": number,
            "outcome": outcome,
            "error_class": error_class,
            "ago": started_ago,
            "finished_ago": finished_ago,
        },
    )


def test_the_scraping_metrics_come_from_the_database(db_engine: Engine, make_tenant) -> None:
    shop, _ = make_tenant("shop")
    crawler, _ = make_tenant("crawler")
    make_tenant("idle")
    with db_engine.begin() as conn:
        # Queue: shop has 2 high (one due for 100 s) and 1 normal in backoff; crawler 3 low.
        add_job(conn, shop.id, priority="high", due_in=-100)
        add_job(conn, shop.id, priority="high")
        add_job(conn, shop.id, due_in=3600)
        for _ in range(3):
            add_job(conn, crawler.id, priority="low")
        # Two jobs running, one of them past its lease (a dead worker).
        add_job(conn, crawler.id, status="running", started_after=0, lease_in=30)
        add_job(conn, crawler.id, status="running", started_after=0, lease_in=-10)
        # Time to first attempt: 19 started jobs, waiting 1..19 s; one accepted long ago
        # (outside the window) that waited an hour.
        for wait in range(1, 20):
            add_job(conn, shop.id, status="succeeded", created_ago=60, started_after=wait)
        old = conn.execute(
            text("UPDATE scraping.jobs SET id = :old_id WHERE id = :id RETURNING id"),
            {
                "id": add_job(conn, shop.id, status="failed", created_ago=7200, started_after=3600),
                "old_id": uuid7(unix_ms=1_000_000_000_000),
            },
        )
        assert old.one()
        # Attempts in the window: a.example 2 failed of 3, b.example 1 of 1 fine; outside
        # the window, in flight or cancelled: not counted.
        a1 = add_job(conn, shop.id, url="https://A.example:8443/p", status="failed")
        a2 = add_job(conn, shop.id, url="https://user@a.example/q", status="queued")
        b1 = add_job(conn, crawler.id, url="http://b.example/", status="succeeded")
        add_attempt(conn, a1, 1, "failed", "http_401")
        add_attempt(conn, a2, 1, "retry", "timeout")
        add_attempt(conn, a2, 2, "succeeded")
        add_attempt(conn, b1, 1, "succeeded")
        add_attempt(conn, a2, 3, "failed", "http_500", started_ago=7200, finished_ago=7100)
        add_attempt(conn, b1, 2, None)
        add_attempt(conn, b1, 3, "cancelled", "cancelled")
        seeded = conn.execute(text("SELECT now()")).scalar_one()  # the seed's own clock

    got = samples(generate_latest(metrics_registry(db_engine)).decode())
    with db_engine.connect() as conn:
        since_seed = (conn.execute(text("SELECT now()")).scalar_one() - seeded).total_seconds()

    def depth(tenant: str, priority: str) -> float:
        return got[("scraping_queue_depth", (("priority", priority), ("tenant", tenant)))]

    # The queue: the seeded jobs plus a2 (queued with an attempt behind it).
    assert depth("shop", "high") == 2 and depth("shop", "normal") == 2
    assert depth("crawler", "low") == 3 and depth("crawler", "high") == 0
    assert depth("idle", "normal") == 0
    # Due 100 s before the seed, read at most `since_seed` after it (a starved test's
    # scrape comes late: the bound is PostgreSQL's, not a guess of 10 s).
    assert 100 <= got[("scraping_oldest_queued_job_age_seconds", ())] <= 100 + since_seed + 1
    assert got[("scraping_jobs_running_past_lease", ())] == 1
    # percentile_cont over the 19 waits of 1..19 s and the window's other jobs (the queue
    # and a2, waiting ~0 s; the two running ones, 0 s).
    waits = sorted([float(w) for w in range(1, 20)] + [0.0] * 9)
    rank = 0.95 * (len(waits) - 1)
    lower = int(rank)
    expected = waits[lower] + (waits[lower + 1] - waits[lower]) * (rank - lower)
    assert got[("scraping_time_to_first_attempt_jobs", ())] == len(waits)
    assert got[("scraping_time_to_first_attempt_p95_seconds", ())] == pytest.approx(
        expected, abs=0.5
    )
    assert got[("scraping_attempts_recent", ())] == 4
    assert got[("scraping_failure_share_by_class", (("error_class", "http_401"),))] == 0.25
    assert got[("scraping_failure_share_by_class", (("error_class", "timeout"),))] == 0.25
    assert ("scraping_failure_share_by_class", (("error_class", "http_500"),)) not in got
    assert got[("scraping_failure_share_by_domain", (("domain", "a.example"),))] == (
        pytest.approx(2 / 3)
    )
    assert ("scraping_failure_share_by_domain", (("domain", "b.example"),)) not in got


def test_the_api_serves_them_with_its_cache_hit_ratio(
    db_engine: Engine, local_store: LocalResultStore, make_tenant, redis_url: str
) -> None:
    _, key = make_tenant("shop")
    settings = dataclasses.replace(
        TEST_SETTINGS, redis_url=redis_url, metrics_token="operators-only-0123456789"
    )
    app = create_app(lambda: db_engine, local_store, settings, listen_for_invalidations=False)
    with TestClient(app) as client:
        job_id = client.post("/jobs", json={"url": "https://a.example/"}, headers=auth(key))
        for _ in range(4):  # 1 miss, then 3 hits
            client.get(f"/jobs/{job_id.json()['id']}", headers=auth(key))
        answer = client.get("/metrics", headers=auth("operators-only-0123456789"))
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    got = samples(answer.text)
    assert got[("scraping_job_cache_hits_total", ())] == 3
    assert got[("scraping_job_cache_misses_total", ())] == 1
    assert got[("scraping_job_cache_hit_ratio", ())] == 0.75
    assert got[("scraping_queue_depth", (("priority", "normal"), ("tenant", "shop")))] == 1
    assert ("scraping_oldest_queued_job_age_seconds", ()) in got


METRICS_TOKEN = "operators-only-0123456789"


def test_the_api_port_serves_metrics_only_to_the_operators_token(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """Tenant names, queue depths and failing hosts are operators' data: without
    PIN_METRICS_TOKEN the API does not serve /metrics at all; with it, only to its bearer —
    not to a tenant's key, nor to nobody."""
    _, key = make_tenant("shop")
    with TestClient(create_app(lambda: db_engine, local_store, TEST_SETTINGS)) as client:
        assert client.get("/metrics").status_code == 404
        assert client.get("/metrics", headers=auth(key)).status_code == 404
    settings = dataclasses.replace(TEST_SETTINGS, metrics_token=METRICS_TOKEN)
    with TestClient(create_app(lambda: db_engine, local_store, settings)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=auth(key)).status_code == 401
        assert client.get("/metrics", headers=auth(METRICS_TOKEN + "x")).status_code == 401
        answer = client.get("/metrics", headers=auth(METRICS_TOKEN))
        assert answer.status_code == 200
        assert ("scraping_oldest_queued_job_age_seconds", ()) in samples(answer.text)


def test_the_database_gauges_are_computed_once_per_cache_period(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """Scrapes within PIN_METRICS_CACHE_SECONDS answer the gauges computed by the first (a
    job accepted in between is not counted yet); with a period of 0 every scrape reads."""
    _, key = make_tenant("shop")
    depth = ("scraping_queue_depth", (("priority", "normal"), ("tenant", "shop")))
    # 10 minutes: no starved test's two scrapes are that far apart.
    for cache_seconds, expected in ((600.0, 1), (0.0, 2)):
        settings = dataclasses.replace(
            TEST_SETTINGS, metrics_token=METRICS_TOKEN, metrics_cache_seconds=cache_seconds
        )
        with TestClient(create_app(lambda: db_engine, local_store, settings)) as client:
            client.post("/jobs", json={"url": "https://a.example/"}, headers=auth(key))
            first = samples(client.get("/metrics", headers=auth(METRICS_TOKEN)).text)
            client.post("/jobs", json={"url": "https://a.example/b"}, headers=auth(key))
            second = samples(client.get("/metrics", headers=auth(METRICS_TOKEN)).text)
        assert second[depth] == first[depth] + expected - 1, cache_seconds
        with db_engine.begin() as conn:
            conn.execute(text("DELETE FROM scraping.jobs"))


def test_the_failure_shares_count_attempts_ended_in_the_window(
    db_engine: Engine, make_tenant
) -> None:
    """As their help says: an attempt started long ago and swept as lost just now counts;
    one started in the window and still running does not."""
    shop, _ = make_tenant("shop")
    with db_engine.begin() as conn:
        lost = add_job(conn, shop.id, url="http://slow.example/", status="queued")
        add_attempt(conn, lost, 1, "lost", "lease_expired", started_ago=7200)
        running = add_job(conn, shop.id, url="http://slow.example/2", status="running", lease_in=30)
        add_attempt(conn, running, 1, None)
    got = samples(generate_latest(metrics_registry(db_engine)).decode())
    assert got[("scraping_attempts_recent", ())] == 1
    assert got[("scraping_failure_share_by_class", (("error_class", "lease_expired"),))] == 1
