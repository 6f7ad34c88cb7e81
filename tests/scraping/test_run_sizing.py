"""What the sensor sizes worker runs by (queue_stats' claimable): only what a worker could
claim now, by the claim's own rules — a connection held by a redirect hop is taken, and a
domain starts no more jobs now than its bucket holds tokens."""

from __future__ import annotations

from sqlalchemy import Engine

from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.leases import DomainDefaults, RedirectSlots
from tests.scraping.test_scheduling import claim, enqueue_many


def test_a_connection_held_by_a_redirect_hop_is_not_claimable(
    db_engine: Engine, make_tenant
) -> None:
    tenant, _ = make_tenant("crawler")
    defaults = DomainDefaults(rps=1000, concurrency=2)
    enqueue_many(db_engine, tenant.id, ["http://origin.example/a"])
    [job] = claim(db_engine, 1, defaults)
    enqueue_many(db_engine, tenant.id, [f"http://hop.example/{i}" for i in range(5)])
    # The origin's job was redirected to hop.example: it holds one of its 2 connections.
    slots = RedirectSlots(db_engine, job, hold_seconds=60, domain_defaults=defaults)
    assert slots.take("hop.example") == 0
    with db_engine.connect() as conn:
        stats = leases.queue_stats(conn, defaults)
    assert (stats.due, stats.claimable) == (5, 1)
    assert len(claim(db_engine, 10, defaults)) == 1  # as the claim itself sees it
    slots.release()


def test_a_domain_is_claimable_only_up_to_the_tokens_its_bucket_holds(
    db_engine: Engine, make_tenant
) -> None:
    tenant, _ = make_tenant("crawler")
    defaults = DomainDefaults(rps=2, concurrency=50)
    enqueue_many(db_engine, tenant.id, [f"http://slow.example/{i}" for i in range(30)])
    with db_engine.connect() as conn:
        stats = leases.queue_stats(conn, defaults)
    # A full bucket of a 2 rps domain holds 2 tokens: 2 could start now, not 30.
    assert (stats.due, stats.claimable) == (30, 2)
    assert len(claim(db_engine, 30, defaults)) == 2
    with db_engine.connect() as conn:
        stats = leases.queue_stats(conn, defaults)
    assert stats.claimable == 0  # the bucket is spent
