"""Hostile review of 3427b6f (a round's pauses written first, one host a transaction; the
claim refused outside READ COMMITTED, 0047; robots_crawl_delay naming rps). Windows are
forced with locks held open and waits seen in pg_blocking_pids, never by sleeping. Tests
marked xfail(strict) fail on the code they were written against."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from pin_orchestration.migrations.schema_dump import libpq_url
from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.politeness import pause_domain, set_domain_limits
from pin_orchestration.scraping.worker.backoff import DatabaseBackoff
from tests.scraping.test_fairness_blocked import _claim, _enqueue

ROBOTS_Q = NamedQueries("pin_orchestration.scraping", "robots.sql")


def _robots(engine: Engine, host: str, delay: float | None, default_rps: float = 10000) -> None:
    """robots.txt of http://host stored with `delay` and the host's rate derived from it,
    as the worker's robots_rows does (robots_store, then robots_crawl_delay)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.robots (origin, domain, state, crawl_delay,"
                " fetched_at, expires_at) VALUES (:o, :d, 'rules', :c, now(),"
                " now() + interval '1 hour')"
                " ON CONFLICT (origin) DO UPDATE SET crawl_delay = EXCLUDED.crawl_delay"
            ),
            {"o": f"http://{host}", "d": host, "c": delay},
        )
        conn.execute(ROBOTS_Q("robots_crawl_delay"), {"domain": host, "default_rps": default_rps})


def _flows(engine: Engine, host: str) -> list[tuple]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT tenant_id, ready, waiting_for, wake_at FROM scraping.tenant_flows"
                    " WHERE domain = :d ORDER BY tenant_id"
                ),
                {"d": host},
            )
        ]


# --- 3. robots_crawl_delay names rps: the AFTER UPDATE OF rps trigger fires -------------


@pytest.mark.xfail(
    strict=True,
    reason="domains_domain_queue_update fires on UPDATE OF rps with no WHEN clause: a "
    "robots refresh whose rps is unchanged (Crawl-delay 100 -> 200 both clamp to 0.01 rps) "
    "wakes every flow set aside for the host's next tokens",
)
def test_a_robots_refresh_that_leaves_rps_unchanged_does_not_wake_flows_waiting_for_tokens(
    db_engine: Engine, make_tenant
) -> None:
    """slow.example's Crawl-delay is 100 (rps clamped to 0.01: a token every 100 s). Its
    bucket spent, a claim sets a's and b's flows aside for the next tokens (100 s, 200 s)
    and parks them. robots.txt is fetched again with Crawl-delay 200: the rate is still
    0.01 (greatest(1/220, 0.01)), so nothing should move; the trigger's "limit changed"
    branch sets their wake to now, and every later claim sets them aside again (its
    MAX_SET_ASIDE budget, the tenants unparked and parked again). With the operator's
    configured_rps below the delay's, or workers whose default rps differ (each refresh
    flips robots_default_rps), every refresh does this."""
    w, a, b = (make_tenant(n)[0].id for n in ("w", "a", "b"))
    _robots(db_engine, "slow.example", 100.0)
    _enqueue(db_engine, w, ["http://slow.example/w"])
    assert [j.tenant_id for j in _claim(db_engine, 1)] == [w]  # the bucket is empty now
    _enqueue(db_engine, a, ["http://slow.example/a"])
    _enqueue(db_engine, b, ["http://slow.example/b"])
    assert _claim(db_engine, 8) == []
    before = _flows(db_engine, "slow.example")
    assert before and not any(f[1] for f in before), before

    _robots(db_engine, "slow.example", 200.0)
    with db_engine.connect() as conn:
        rps, delay = conn.execute(
            text("SELECT rps, crawl_delay FROM scraping.domains WHERE domain = 'slow.example'")
        ).one()
    assert (rps, delay) == (0.01, 200.0)  # the refresh was written, the rate unchanged
    assert _flows(db_engine, "slow.example") == before


def test_a_robots_refresh_during_a_pause_neither_lengthens_it_nor_strands_a_tenant(
    db_engine: Engine, make_tenant
) -> None:
    """Held: robots.txt of paused.example refreshed (Crawl-delay 1 -> 2) during a 429's
    pause runs the trigger's pause branch again. The pause keeps its end, u (a job there
    and one on open.example) is not parked, and the claim takes u's open.example job."""
    u = make_tenant("u")[0].id
    _robots(db_engine, "paused.example", 1.0)
    _enqueue(db_engine, u, ["http://paused.example/u1", "http://paused.example/u2"])
    until = pause_domain(db_engine, "paused.example", seconds=600, max_pause_seconds=3600)
    _enqueue(db_engine, u, ["http://open.example/u"])
    _robots(db_engine, "paused.example", 2.0)
    with db_engine.connect() as conn:
        kept = conn.execute(
            text("SELECT blocked_until FROM scraping.domains WHERE domain = 'paused.example'")
        ).scalar_one()
        parked = conn.execute(
            text("SELECT NOT ready FROM scraping.tenant_queues WHERE tenant_id = :u"), {"u": u}
        ).scalar_one()
    assert kept == until
    assert not parked
    assert all(f[3] == until and not f[1] for f in _flows(db_engine, "paused.example"))
    assert [(j.tenant_id, j.domain) for j in _claim(db_engine, 8)] == [(u, "open.example")]


# --- 2. the claim refused outside READ COMMITTED (0047): what a worker says -------------


@pytest.mark.xfail(
    strict=True,
    reason="DatabaseBackoff.failed logs only the exception's first line: the HINT naming "
    "the fix (default_transaction_isolation) is dropped, and the refusal is retried as a "
    "database outage for ever",
)
def test_a_worker_whose_claim_is_refused_for_its_isolation_logs_the_fix(
    db_url: str, db_engine: Engine, caplog: pytest.LogCaptureFixture, make_tenant
) -> None:
    """The workers' role has default_transaction_isolation = 'repeatable read' (what the
    0047 error's hint is about). The worker's claim (claim_due_jobs, in autocommit) is
    refused on every try; its main loop hands the error to DatabaseBackoff.failed, which
    logs a warning and retries in at most 5 s, for ever. The log must carry the fix."""
    u = make_tenant("u")[0].id
    _enqueue(db_engine, u, ["http://open.example/u"])
    engine = create_engine(
        db_url, connect_args={"options": "-c default_transaction_isolation=repeatable\\ read"}
    )
    try:
        with pytest.raises(DBAPIError) as refused:
            _claim(engine, 8)
    finally:
        engine.dispose()
    assert isinstance(refused.value.orig, psycopg.errors.FeatureNotSupported)
    hint = refused.value.orig.diag.message_hint or ""
    assert "default_transaction_isolation" in hint

    with caplog.at_level(logging.WARNING):
        DatabaseBackoff().failed("claim", refused.value)
    assert "default_transaction_isolation" in caplog.text, caplog.text
