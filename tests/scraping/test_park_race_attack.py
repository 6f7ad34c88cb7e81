"""No tenant is parked with a claimable flow, whatever runs beside a park: a pause or a
claim in one snapshot (REPEATABLE READ), a worker's round pausing a host beside a batch
intake, a robots.txt Crawl-delay lifted, a wake by another claim. Found by a hostile
review of migration 0045 (a tenant parked only on what it has once its row is locked),
each test failed before its fix. Windows are forced with gates (test_park_race's shadowed
functions waiting on an advisory lock) or by waiting for a lock wait to show in pg_locks,
never by sleeping."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import Engine, event, text

from pin_orchestration.migrations.schema_dump import libpq_url
from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.store import leases
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


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_a_claim_refuses_to_run_in_one_snapshot_naming_the_fix(
    db_url: str, db_engine: Engine, make_tenant, isolation: str
) -> None:
    """Under REPEATABLE READ (a database's default_transaction_isolation, say) the claim's
    lock and park statements shared the call's one snapshot: intake committed during the
    claim was missed and its tenant parked with a flow ready (forced with test_park_race's
    gate by a hostile review). The claim now refuses there, with the fix in the error, and
    claims nothing; under READ COMMITTED the same job is claimed."""
    u = make_tenant("u")[0].id
    _enqueue(db_engine, u, ["http://open.example/u"])
    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        conn.execute(f"SET default_transaction_isolation = '{isolation}'")
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            conn.execute("SELECT * FROM scraping.claim_jobs('g', 8, 600, 10000, 10000)")
    assert f"only under READ COMMITTED, not {isolation}" in str(refused.value)
    assert "default_transaction_isolation" in (refused.value.diag.message_hint or "")
    assert [(j.tenant_id, j.domain) for j in _claim(db_engine, 8)] == [(u, "open.example")]


def test_a_round_pausing_a_domain_does_not_deadlock_with_a_batch_intake(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """A worker's round (leases.finish_attempts): a redirect hop's 429 pauses b.example,
    whose only tenant w the pause trigger parks, and hands x's job on d.example back.
    Meanwhile a producer posts a batch (one INSERT) of z's job on d.example (d's queue row
    made anew: it had only x's running job) and w's job on e.example: announced in domain
    order, it holds d's new queue row, then takes w's row. When the round held w's row to
    its commit (the pause in the outcomes' transaction), the batch waited for it and the
    round's hand-back then for d's queue row: a deadlock (found by a hostile review). The
    gate: the round stops before its outcomes' statement until the batch has either
    committed or waits for the round."""
    w = make_tenant("w")[0].id
    x = make_tenant("x")[0].id
    z = make_tenant("z")[0].id
    _enqueue(db_engine, x, ["http://d.example/x"])
    [job] = _claim(db_engine, 1)  # x's job running; d.example has no queue row now
    _enqueue(db_engine, w, ["http://b.example/w"])

    url = libpq_url(db_url)
    errors: dict[str, BaseException] = {}
    now = datetime.now(UTC)
    hand_back = leases.AttemptOutcome(
        job_id=job.id,
        attempt=job.attempt,
        status="queued",
        outcome="retry",
        next_attempt_at=now + timedelta(seconds=5),
        job_domain="d.example",
        http_status=429,
        error_class="http_429",
        domain="b.example",
        domain_paused_until=now + timedelta(seconds=600),
    )
    with (
        psycopg.connect(url, autocommit=True) as producer,
        psycopg.connect(url, autocommit=True) as watch,
    ):

        def post() -> None:
            try:
                producer.execute(
                    "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                    " next_attempt_at) VALUES"
                    " (gen_random_uuid(), %s, 'http://d.example/z', 'd.example', 'normal',"
                    "  now() - interval '1 hour'),"
                    " (gen_random_uuid(), %s, 'http://e.example/w', 'e.example', 'normal',"
                    "  now() - interval '1 hour')",
                    (z, w),
                )
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors["intake"] = e

        posting = threading.Thread(target=post)

        def gate(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            if "WITH o AS" not in statement or posting.ident is not None:
                return
            round_pid = cursor.connection.info.backend_pid
            posting.start()
            waits = "SELECT %s = ANY (pg_blocking_pids(%s))"
            producer_pid = producer.info.backend_pid
            while posting.is_alive():
                if watch.execute(waits, (round_pid, producer_pid)).fetchone()[0]:
                    return
                posting.join(0.01)

        event.listen(db_engine, "before_cursor_execute", gate)
        try:
            leases.finish_attempts(db_engine, worker="w", outcomes=[hand_back])
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors["round"] = e
        finally:
            event.remove(db_engine, "before_cursor_execute", gate)
        assert posting.ident is not None, "the round never reached its outcomes"
        posting.join(timeout=60)
        assert not posting.is_alive()

    assert not errors, errors
    with db_engine.connect() as conn:
        domains = conn.execute(
            text("SELECT domain, status FROM scraping.jobs ORDER BY domain, tenant_id")
        ).all()
    assert ("e.example", "queued") in domains and len(domains) == 4, domains


def test_a_crawl_delay_lifted_by_robots_wakes_the_flows_waiting_for_its_tokens(
    db_engine: Engine, make_tenant
) -> None:
    """slow.example's robots.txt says Crawl-delay: 100 (a token every 110 s); a claim sets
    a's and b's flows aside for the next tokens (110 s, 220 s) and parks them. robots.txt is
    fetched again without the delay (the worker's robots_store + robots_crawl_delay): the
    rate is the default again, so the next claim takes both jobs, as it does after an
    operator's set_domain_limits (trigger domains_domain_queue, "a limit changed")."""
    robots_q = NamedQueries("pin_orchestration.scraping", "robots.sql")
    w = make_tenant("w")[0].id
    a, b = _two_tenants(make_tenant)

    def robots(delay: float | None) -> None:
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO scraping.robots (origin, domain, state, crawl_delay,"
                    " fetched_at, expires_at) VALUES ('http://slow.example', 'slow.example',"
                    " 'rules', :d, now(), now() + interval '1 hour')"
                    " ON CONFLICT (origin) DO UPDATE SET crawl_delay = EXCLUDED.crawl_delay"
                ),
                {"d": delay},
            )
            conn.execute(
                robots_q("robots_crawl_delay"), {"domain": "slow.example", "default_rps": 10000}
            )

    robots(100.0)
    _enqueue(db_engine, w, ["http://slow.example/w"])
    assert [j.tenant_id for j in _claim(db_engine, 1)] == [w]  # the bucket is empty now
    _enqueue(db_engine, a, ["http://slow.example/a"])
    _enqueue(db_engine, b, ["http://slow.example/b"])
    assert _claim(db_engine, 8) == []  # set aside for the next tokens, a and b parked

    robots(None)
    later = sorted(j.tenant_id for j in _claim(db_engine, 8))
    assert later == [a, b], later


def test_a_set_aside_does_not_park_a_tenant_another_claims_wake_just_gave_a_ready_flow(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """Held (a guard; fails with 0045 reverted): the wake variant of 0045's race. A claim
    picks t and sets slow.example's flows aside (t's and u's, the bucket empty). Gate:
    inside its park statement (after its snapshot), the clock passes u's due time on
    due.example and another claim of one job wakes u's flow there (ready; u's row locked,
    not written: it was not parked) and starts x's job (x's turn before u's). u must not be
    parked with that flow ready: its job would wait for slow.example's next token."""
    t, x, u = sorted(make_tenant(name)[0].id for name in ("p", "q", "r"))
    w = make_tenant("w")[0].id
    set_domain_limits(db_engine, "slow.example", rps=0.01, concurrency=None)
    _enqueue(db_engine, w, ["http://slow.example/w"])
    assert [j.tenant_id for j in _claim(db_engine, 1)] == [w]  # the bucket is empty now
    _enqueue(db_engine, t, ["http://slow.example/t"])
    _enqueue(db_engine, u, ["http://slow.example/u"])
    _enqueue(db_engine, x, ["http://open.example/x"])
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                " next_attempt_at) VALUES (gen_random_uuid(), :u, 'http://due.example/u',"
                " 'due.example', 'normal', now() + interval '1 hour')"
            ),
            {"u": u},
        )

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
        # the clock passes the due time
        watch.execute(
            "UPDATE scraping.jobs SET next_attempt_at = now() - interval '1 second'"
            " WHERE domain = 'due.example'"
        )
        watch.execute(
            "UPDATE scraping.tenant_flows SET wake_at = now() - interval '1 second'"
            " WHERE domain = 'due.example'"
        )
        watch.execute("SET lock_timeout = '10s'")
        other = watch.execute(
            "SELECT tenant_id, domain FROM scraping.claim_jobs('o', 1, 600, 10000, 10000)"
        ).fetchall()
        assert other == [(x, "open.example")], other
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
        claim.close()

    stranded = _parked_with_a_ready_flow(db_engine)
    later = [(j.tenant_id, j.domain) for j in _claim(db_engine, 8)]
    assert (u, "due.example") in claim.rows + later, (stranded, claim.rows, later)
    assert not stranded
