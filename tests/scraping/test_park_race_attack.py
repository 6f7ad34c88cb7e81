"""Attacks on migration 0045 (a tenant parked only on what it has once its row is locked).

0045 locks the tenants to park in one statement and parks them in the next, "whose
snapshot sees every intake that held the row before the lock". Each test here tries to get
a tenant parked (tenant_queues.ready = false) while it has a ready flow with a claimable
job, or another liveness break around the two statements. Windows are forced with gates
(tests/scraping/test_park_race.py's shadowed functions waiting on an advisory lock) or by
waiting for a lock wait to show in pg_locks, never by sleeping."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from sqlalchemy import Engine

from pin_orchestration.migrations.schema_dump import libpq_url
from pin_orchestration.scraping.store.politeness import set_domain_limits
from tests.scraping.test_fairness_blocked import _claim, _enqueue
from tests.scraping.test_park_race import (
    GATE_KEY,
    GATED_UNNEST,
    _Gated,
    _intake,
    _parked_with_a_ready_flow,
    _two_tenants,
)


@pytest.mark.xfail(
    strict=True,
    reason="0045's second statement has a fresh snapshot only under READ COMMITTED: in a "
    "REPEATABLE READ transaction (an operator's, or default_transaction_isolation set on "
    "the database) every statement of the pause trigger uses the transaction's snapshot, "
    "so intake committed after it is missed and the tenant parked with its flow ready",
)
def test_a_pause_in_a_repeatable_read_transaction_does_not_strand_a_tenant(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """An operator pauses paused.example inside a REPEATABLE READ transaction whose
    snapshot was taken before u's job on open.example was posted (and committed: intake
    holds u's row FOR SHARE only until then, so nothing is skipped). u must not be parked
    with open.example ready: its job would wait for the pause to end (an hour)."""
    u = make_tenant("u")[0].id
    _enqueue(db_engine, u, ["http://paused.example/u"])
    url = libpq_url(db_url)
    with (
        psycopg.connect(url) as operator,
        psycopg.connect(url, autocommit=True) as producer,
    ):
        operator.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        operator.execute("SELECT 1")  # the transaction's snapshot
        _intake(producer, u, "http://open.example/u")
        operator.execute(
            "SELECT scraping.pause_domain('paused.example', now() + interval '1 hour')"
        )
        operator.commit()

    stranded = _parked_with_a_ready_flow(db_engine)
    later = [(j.tenant_id, j.domain) for j in _claim(db_engine, 8)]
    assert not stranded, (stranded, later)
    assert later == [(u, "open.example")], later


@pytest.mark.xfail(
    strict=True,
    reason="under default_transaction_isolation = 'repeatable read' the claim (one "
    "autocommit statement) runs its lock and park statements in one snapshot, taken when "
    "the call began: the race 0045 fixed is back, with a window of the whole claim",
)
def test_a_claim_under_repeatable_read_does_not_park_a_tenant_intake_just_gave_a_ready_flow(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """test_park_race's set-aside race, the claim's connection set to REPEATABLE READ
    (as a database whose default_transaction_isolation is set would run it)."""
    t, u = _two_tenants(make_tenant)
    w = make_tenant("w")[0].id
    set_domain_limits(db_engine, "slow.example", rps=0.01, concurrency=None)
    _enqueue(db_engine, w, ["http://slow.example/w"])
    assert [j.tenant_id for j in _claim(db_engine, 1)] == [w]  # the bucket is empty now
    _enqueue(db_engine, t, ["http://slow.example/t"])
    _enqueue(db_engine, u, ["http://slow.example/u"])

    claim = _Gated(
        db_url,
        GATED_UNNEST,
        f"SET parkgate.tenant = '{u}'; SET default_transaction_isolation = 'repeatable read'",
        "SELECT tenant_id, domain FROM scraping.claim_jobs('g', 8, 600, 10000, 10000)",
    )
    with (
        psycopg.connect(claim.url, autocommit=True) as gate,
        psycopg.connect(claim.url, autocommit=True) as watch,
    ):
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        claim.run_until_the_gate(watch)
        _intake(watch, u, "http://open.example/u")
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
        claim.close()

    stranded = _parked_with_a_ready_flow(db_engine)
    later = [(j.tenant_id, j.domain) for j in _claim(db_engine, 8)]
    assert (u, "open.example") in claim.rows + later, (stranded, claim.rows, later)
    assert not stranded
