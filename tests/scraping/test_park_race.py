"""A tenant is never parked while it has a flow ready (liveness: a parked tenant comes back
only when one of its set-aside flows wakes or intake announces a claimable job of it).

Two statements park tenants other than the one their transaction holds: a claim's
set-aside of a domain without room (the tenants of the flows it set aside, left with none
ready) and a pause (the domain's tenants, by trigger). Each checked "no ready flow" in its
snapshot and then SKIP-LOCKed the tenant's row: intake of a job of that tenant on another,
claimable domain that committed between the two (intake holds a ready tenant's row only
FOR SHARE, which leaves no new row version, so nothing is checked again) left the tenant
parked with that flow ready, its job stranded until the set-aside flow woke (the next
token, the pause's end: up to an hour). Migration 0045 locks the tenants first and checks
their flows in a statement of its own, whose snapshot sees every intake that let go of the
row before the lock.

The window is forced with a gate, not a race: a function the statement calls, shadowed in
the connection's search path (a schema before pg_catalog) by one that first waits for an
advisory lock the test holds, so the statement stops after its snapshot and before its
lock; the test commits the intake meanwhile, then opens the gate."""

from __future__ import annotations

import threading
import uuid

import psycopg
from sqlalchemy import Engine, text

from pin_orchestration.migrations.schema_dump import libpq_url
from pin_orchestration.scraping.store.politeness import set_domain_limits
from tests.scraping.test_fairness_blocked import _claim, _enqueue

GATE_KEY = 4343

# unnest(anyarray), shadowed: waits at the gate the first time it is given an array that
# holds parkgate.tenant (the claim's park statement unnests the tenants set aside).
GATED_UNNEST = """
CREATE FUNCTION parkgate.unnest(a anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('parkgate.tenant', true), '') <> ''
       AND a::text LIKE '%' || current_setting('parkgate.tenant') || '%' THEN
        PERFORM set_config('parkgate.tenant', '', false);
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(%(key)s);
    END IF;
    RETURN QUERY SELECT pg_catalog.unnest(a);
END
$$
"""

# uuid = uuid, shadowed: waits at the gate at its first call once armed (in the pause
# trigger, the first statement comparing uuids is the one parking tenants).
GATED_UUID_EQ = """
CREATE FUNCTION parkgate.uuid_eq(a uuid, b uuid) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('parkgate.armed', true) = 'on' THEN
        PERFORM set_config('parkgate.armed', 'off', false);
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(%(key)s);
    END IF;
    RETURN a OPERATOR(pg_catalog.=) b;
END
$$;
CREATE OPERATOR parkgate.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = parkgate.uuid_eq);
-- a row comparison (a, b) IN (...) takes only an operator of a btree family
CREATE OPERATOR FAMILY parkgate.uuid_gate USING btree;
ALTER OPERATOR FAMILY parkgate.uuid_gate USING btree ADD OPERATOR 3 parkgate.= (uuid, uuid)
"""


class _Gated:
    """`statement` run in a thread on a connection of its own, whose search path puts
    schema parkgate (holding `gate_sql`) before pg_catalog; `setup` runs there first."""

    def __init__(self, db_url: str, gate_sql: str, setup: str, statement: str) -> None:
        self.url = libpq_url(db_url)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA parkgate")
            conn.execute(gate_sql.replace("%(key)s", str(GATE_KEY)))
        self.conn = psycopg.connect(self.url, autocommit=True)
        self.conn.execute("SET search_path = parkgate, pg_catalog, public")
        self.conn.execute(setup)
        self.pid = self.conn.info.backend_pid
        self.statement = statement
        self.rows: list[tuple[object, ...]] = []
        self.errors: list[BaseException] = []
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self.rows.extend(self.conn.execute(self.statement).fetchall())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)
        finally:
            self.finished.set()

    def run_until_the_gate(self, watch: psycopg.Connection) -> None:
        self.thread.start()
        stopped = "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND NOT granted"
        while not self.finished.is_set() and watch.execute(stopped, (self.pid,)).fetchone() is None:
            self.finished.wait(0.01)
        assert not self.finished.is_set(), f"never reached the gate: {self.errors}"

    def close(self) -> None:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        self.conn.close()
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA parkgate CASCADE")
        assert not self.errors, self.errors


def _intake(watch: psycopg.Connection, tenant_id: uuid.UUID, url: str) -> None:
    """A job posted and committed; it must not wait for the gated statement."""
    watch.execute("SET lock_timeout = '10s'")
    watch.execute(
        "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority, next_attempt_at)"
        " VALUES (gen_random_uuid(), %s, %s, split_part(split_part(%s, '://', 2), '/', 1),"
        " 'normal', now() - interval '1 hour')",
        (tenant_id, url, url),
    )


def _parked_with_a_ready_flow(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT t.tenant_id, f.domain FROM scraping.tenant_queues t"
                    " JOIN scraping.tenant_flows f"
                    "   ON f.priority = t.priority AND f.tenant_id = t.tenant_id"
                    " WHERE NOT t.ready AND f.ready"
                )
            )
        ]


def _two_tenants(make_tenant) -> tuple[uuid.UUID, uuid.UUID]:
    """Two new tenants, by id: at equal start tags the pick takes the first."""
    first, second = sorted(make_tenant(name)[0].id for name in ("p", "q"))
    return first, second


def test_a_set_aside_does_not_park_a_tenant_intake_just_gave_a_ready_flow(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """A claim picks t, whose flow is on a domain with an empty bucket (next token in
    100 s): it sets the domain's flows aside, t's and u's, and parks the tenants left with
    none ready. Gate: inside that park statement (after its snapshot), u's job on another
    domain, claimable, is posted and committed. u must not be parked: its job is claimed
    (by this claim or the next), not stranded until the token."""
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
        f"SET parkgate.tenant = '{u}'",
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


def test_a_pause_does_not_park_a_tenant_intake_just_gave_a_ready_flow(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """A pause of an hour sets the domain's flows aside and parks the tenants it leaves
    with none ready (trigger domains_domain_queue). Gate: inside that park statement
    (after its snapshot), u's job on another domain, claimable, is posted and committed.
    u must not be parked: the next claim takes its job, not an hour later."""
    u = make_tenant("u")[0].id
    _enqueue(db_engine, u, ["http://paused.example/u"])

    pause = _Gated(
        db_url,
        GATED_UUID_EQ,
        "SET parkgate.armed = 'on'",
        "SELECT scraping.pause_domain('paused.example', now() + interval '1 hour')",
    )
    with (
        psycopg.connect(pause.url, autocommit=True) as gate,
        psycopg.connect(pause.url, autocommit=True) as watch,
    ):
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        pause.run_until_the_gate(watch)
        _intake(watch, u, "http://open.example/u")
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
        pause.close()

    stranded = _parked_with_a_ready_flow(db_engine)
    later = [(j.tenant_id, j.domain) for j in _claim(db_engine, 8)]
    assert later == [(u, "open.example")], (stranded, later)
    assert not stranded


def test_intake_waiting_for_the_claim_that_parks_its_tenant_brings_it_back(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """The tenant the claim picked from (its row held since the pick) is parked when its
    only flow goes aside: intake of a job of it on another domain meanwhile inserts its flow
    and then waits for the tenant's row (FOR SHARE), so the claim parks it without seeing
    that flow; once the claim commits, intake finds the tenant parked and brings it back.
    Already so before 0045; a guard: the next claim takes the job."""
    u = make_tenant("u")[0].id
    w = make_tenant("w")[0].id
    set_domain_limits(db_engine, "slow.example", rps=0.01, concurrency=None)
    _enqueue(db_engine, w, ["http://slow.example/w"])
    assert [j.tenant_id for j in _claim(db_engine, 1)] == [w]  # the bucket is empty now
    _enqueue(db_engine, u, ["http://slow.example/u"])

    claim = _Gated(
        db_url,
        GATED_UNNEST,
        f"SET parkgate.tenant = '{u}'",
        "SELECT tenant_id, domain FROM scraping.claim_jobs('g', 8, 600, 10000, 10000)",
    )
    intake_errors: list[BaseException] = []
    with (
        psycopg.connect(claim.url, autocommit=True) as gate,
        psycopg.connect(claim.url, autocommit=True) as watch,
        psycopg.connect(claim.url, autocommit=True) as producer,
    ):
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        claim.run_until_the_gate(watch)

        def intake() -> None:
            try:
                _intake(producer, u, "http://open.example/u")
            except BaseException as e:  # noqa: BLE001 - reported by the test
                intake_errors.append(e)

        producer_pid = producer.info.backend_pid
        posting = threading.Thread(target=intake)
        posting.start()
        waits_for_the_claim = "SELECT %s = ANY (pg_blocking_pids(%s))"
        while not watch.execute(waits_for_the_claim, (claim.pid, producer_pid)).fetchone()[0]:
            assert posting.is_alive(), f"intake did not wait for the claim: {intake_errors}"
            posting.join(0.01)
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
        claim.close()
        posting.join(timeout=60)
        assert not posting.is_alive()
    assert not intake_errors, intake_errors

    assert claim.rows == []
    later = [(j.tenant_id, j.domain) for j in _claim(db_engine, 8)]
    assert later == [(u, "open.example")], (_parked_with_a_ready_flow(db_engine), later)
