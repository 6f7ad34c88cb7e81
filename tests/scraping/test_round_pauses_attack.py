"""A round's pause beside the sweeper, a batch intake and robots.txt refreshes, and a worker
whose claim is refused for its isolation: found by a hostile review of 3427b6f, each test
failed before its fix (0048: a pause locks its host's queue rows and flows in key order
before the host's row, and the trigger fires only on a change; the worker logs the
database's hint). Windows are forced with locks held open and waits seen in
pg_blocking_pids, never by sleeping."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from pin_orchestration.migrations.schema_dump import libpq_url
from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.politeness import pause_domain
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


# --- 1. a round's pause beside the sweeper -----------------------------------------------


def _waiting_on(watch: psycopg.Connection, holder: int, marker: str) -> int | None:
    """The backend whose statement contains `marker`, waiting (directly) on `holder`, or
    on a backend queued before it for the same row (a tuple lock's next in line)."""
    row = watch.execute(
        "SELECT pid FROM pg_stat_activity WHERE position(%s IN query) > 0"
        " AND cardinality(pg_blocking_pids(pid)) > 0"
        " AND (%s = ANY (pg_blocking_pids(pid)) OR EXISTS (SELECT 1 FROM pg_stat_activity b"
        "      WHERE b.pid = ANY (pg_blocking_pids(pg_stat_activity.pid))"
        "        AND %s = ANY (pg_blocking_pids(b.pid))))",
        (marker, holder, holder),
    ).fetchone()
    return row[0] if row else None


def _until_waiting(
    watch: psycopg.Connection, holder: int, marker: str, thread: threading.Thread
) -> None:
    deadline = time.monotonic() + 20
    while _waiting_on(watch, holder, marker) is None and thread.is_alive():
        if time.monotonic() > deadline:
            activity = watch.execute(
                "SELECT pid, pg_blocking_pids(pid), wait_event_type, left(query, 80)"
                " FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchall()
            raise AssertionError(f"{marker} never waited on {holder}: {activity}")
        thread.join(0.01)


def test_a_rounds_pause_does_not_deadlock_with_the_sweeper_on_one_hosts_queue_rows(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """d.example has a queue row per class: normal's made first (earlier in the heap), then
    high's. The sweeper locks a domain's queue rows in (domain, priority) order: high, then
    normal (lock_domain_queues); a round's pause (pause_domain's trigger) updates them in
    whatever order its scan meets them. Gate: a third transaction (an intake or a round
    holding d's high queue row) holds that row while the sweeper waits for it and the pause
    has locked normal's and waits for high's too. Let go, the sweeper takes high and waits
    for normal (the pause's), the pause waits for the sweeper: a deadlock, one of them
    killed (a round's pauses fail, and its outcomes are not written)."""
    u = make_tenant("u")[0].id
    _enqueue(db_engine, u, ["http://d.example/n1", "http://d.example/n2"])
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                " next_attempt_at) SELECT gen_random_uuid(), :u, 'http://d.example/h' || i,"
                " 'd.example', 'high', now() - interval '1 hour' FROM generate_series(1, 2) i"
            ),
            {"u": u},
        )
    jobs = _claim(db_engine, 2)
    assert len(jobs) == 2
    swept_job, round_job = jobs
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = :id"
            ),
            {"id": swept_job.id},
        )
        queues = (
            conn.execute(
                text("SELECT priority FROM scraping.domain_queues WHERE domain = 'd.example'")
            )
            .scalars()
            .all()
        )
    assert set(queues) >= {"high", "normal"}, queues

    now = datetime.now(UTC)
    outcome = leases.AttemptOutcome(
        job_id=round_job.id,
        attempt=round_job.attempt,
        status="queued",
        outcome="retry",
        next_attempt_at=now + timedelta(seconds=120),
        job_domain="d.example",
        http_status=429,
        error_class="http_429",
        domain="d.example",
        domain_paused_until=now + timedelta(seconds=600),
    )
    errors: dict[str, BaseException] = {}

    def sweep() -> None:
        try:
            leases.sweep_expired_leases(db_engine, max_attempts=5)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors["sweeper"] = e

    def round_() -> None:
        try:
            leases.finish_attempts(
                db_engine, worker="w", outcomes=[outcome], max_pause_seconds=3600
            )
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors["round"] = e

    url = libpq_url(db_url)
    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as watch:
        holder.execute(
            "SELECT 1 FROM scraping.domain_queues WHERE domain = 'd.example'"
            " AND priority = 'high' FOR NO KEY UPDATE"
        )
        hpid = holder.info.backend_pid
        sweeper = threading.Thread(target=sweep)
        sweeper.start()
        _until_waiting(watch, hpid, "domain_queues", sweeper)
        pauser = threading.Thread(target=round_)
        pauser.start()
        _until_waiting(watch, hpid, "pause_domain", pauser)
        held = watch.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE position('pause_domain' IN a.query) > 0 AND l.locktype = 'transactionid'"
            " AND l.granted"
        ).fetchone()[0]
        holder.commit()
        sweeper.join(60)
        pauser.join(60)
        assert not sweeper.is_alive() and not pauser.is_alive()
    assert not errors, (held, errors)


def _a_hop_429_pausing_d(round_job: leases.ClaimedJob) -> leases.AttemptOutcome:
    """The round's outcome: the job on a.example failed on a 429 from a redirect hop to
    d.example, which it pauses for 600 s."""
    now = datetime.now(UTC)
    return leases.AttemptOutcome(
        job_id=round_job.id,
        attempt=round_job.attempt,
        status="failed",
        outcome="failed",
        job_domain="a.example",
        http_status=429,
        error_class="http_429",
        domain="d.example",
        domain_paused_until=now + timedelta(seconds=600),
    )


def _pause_beside_a_batch(
    db_url: str,
    db_engine: Engine,
    outcome: leases.AttemptOutcome,
    hold: tuple[str, tuple[object, ...]],
    batch: tuple[str, tuple[object, ...]],
) -> None:
    """Gate: a third transaction runs `hold` (a row lock) until the batch (`batch`, one
    INSERT) waits for it and the round's pause waits behind it; then lets go. Both must
    commit: neither is a deadlock's victim."""
    errors: dict[str, BaseException] = {}
    url = libpq_url(db_url)

    def round_() -> None:
        try:
            leases.finish_attempts(
                db_engine, worker="w", outcomes=[outcome], max_pause_seconds=3600
            )
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors["round"] = e

    with (
        psycopg.connect(url) as holder,
        psycopg.connect(url, autocommit=True) as producer,
        psycopg.connect(url, autocommit=True) as watch,
    ):

        def post() -> None:
            try:
                producer.execute(*batch)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors["intake"] = e

        holder.execute(*hold)
        hpid = holder.info.backend_pid
        posting = threading.Thread(target=post)
        posting.start()
        _until_waiting(watch, hpid, "INSERT INTO scraping.jobs", posting)
        pauser = threading.Thread(target=round_)
        pauser.start()
        _until_waiting(watch, hpid, "pause_domain", pauser)
        holder.commit()
        posting.join(60)
        pauser.join(60)
        assert not posting.is_alive() and not pauser.is_alive()
    assert not errors, {k: str(v) for k, v in errors.items()}


def test_a_rounds_pause_does_not_deadlock_with_a_batch_intake_on_one_hosts_queue_rows(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """d.example's queue rows wait for a later due time (jobs scheduled in an hour), normal's
    made first. A producer posts a batch (one INSERT) of a high and a normal job due now:
    announced in (domain, priority) order, it upserts high's queue row, then normal's. A
    round's pause of d.example (a 429 from a redirect hop to it) updated normal's first, in
    its trigger's scan order: held on high's row, the batch and the pause deadlocked."""
    u = make_tenant("u")[0].id
    x = make_tenant("x")[0].id
    with db_engine.begin() as conn:
        for priority in ("normal", "high"):
            conn.execute(
                text(
                    "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                    " next_attempt_at) VALUES (gen_random_uuid(), :u, 'http://d.example/' ||"
                    " :p, 'd.example', :p, now() + interval '1 hour')"
                ),
                {"u": u, "p": priority},
            )
    _enqueue(db_engine, x, ["http://a.example/x"])
    [round_job] = _claim(db_engine, 1)
    _pause_beside_a_batch(
        db_url,
        db_engine,
        _a_hop_429_pausing_d(round_job),
        hold=(
            "SELECT 1 FROM scraping.domain_queues WHERE domain = 'd.example'"
            " AND priority = 'high' FOR NO KEY UPDATE",
            (),
        ),
        batch=(
            "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
            " next_attempt_at) VALUES"
            " (gen_random_uuid(), %s, 'http://d.example/h', 'd.example', 'high',"
            "  now() - interval '1 hour'),"
            " (gen_random_uuid(), %s, 'http://d.example/n', 'd.example', 'normal',"
            "  now() - interval '1 hour')",
            (u, u),
        ),
    )


def test_a_rounds_pause_does_not_deadlock_with_a_batch_intake_on_one_hosts_flows(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """d.example's normal queue is ready (w's job due now); t1's and t2's flows there wait
    for jobs scheduled in an hour, t2's made first (t1 < t2). A batch posts a job due now
    for each: announced in tenant order, it upserts t1's flow, then t2's (the queue row
    only read under KEY SHARE, which a pause does not wait for). A round's pause of
    d.example updated t2's flow first: held on t1's flow, a deadlock."""
    w = make_tenant("w")[0].id
    t1, t2 = sorted(make_tenant(n)[0].id for n in ("t1", "t2"))
    x = make_tenant("x")[0].id
    _enqueue(db_engine, x, ["http://a.example/x"])
    [round_job] = _claim(db_engine, 1)
    _enqueue(db_engine, w, ["http://d.example/w"])
    with db_engine.begin() as conn:
        for t in (t2, t1):
            conn.execute(
                text(
                    "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                    " next_attempt_at) VALUES (gen_random_uuid(), :t, 'http://d.example/'"
                    " || :t, 'd.example', 'normal', now() + interval '1 hour')"
                ),
                {"t": t},
            )
    _pause_beside_a_batch(
        db_url,
        db_engine,
        _a_hop_429_pausing_d(round_job),
        hold=(
            "SELECT 1 FROM scraping.tenant_flows WHERE domain = 'd.example'"
            " AND tenant_id = %s FOR NO KEY UPDATE",
            (t1,),
        ),
        batch=(
            "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
            " next_attempt_at) SELECT gen_random_uuid(), t,"
            " 'http://d.example/now/' || t, 'd.example', 'normal',"
            " now() - interval '1 hour' FROM unnest(%s::uuid[]) t",
            ([t2, t1],),
        ),
    )
