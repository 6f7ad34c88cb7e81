"""The "fair by jobs started" pick (migration 0039) as a hostile operator, client or second
worker would meet it: each test drives a wake path (a job finishing, a hop's slot given
back, the sweeper, the requeue runbook, an operator's limits, resume or reset of a domain,
a producer's own transaction) with real connections and gates, then asks the promise of
docs/jobs/scraping.md "Scheduling": a queued, due job on a domain with room is claimed,
no tenant is left parked with a flow ready, a claim never waits on a client."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
from sqlalchemy import Connection, Engine, text

from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.politeness import (
    pause_domain,
    resume_domain,
    set_domain_limits,
)
from pin_orchestration.scraping.store.tenancy import set_tenant_weight
from tests.chessboard.test_concurrency import wait_until_blocked
from tests.scraping.test_scheduling import claim, enqueue

FULL = "full.example"


def _structure_faults(engine: Engine) -> list[str]:
    """What would leave a queued job out of the pick: a job without its flow or tenant row,
    a flow on a domain without its state row (nothing to lock its limits by), a tenant
    parked with a flow ready."""
    with engine.connect() as conn:
        faults = [
            f"queued job {r.id} on {r.domain} outside the pick"
            for r in conn.execute(
                text(
                    "SELECT j.id, j.domain FROM scraping.jobs j"
                    " LEFT JOIN scraping.tenant_flows f ON f.domain = j.domain"
                    "   AND f.priority = j.priority AND f.tenant_id = j.tenant_id"
                    " LEFT JOIN scraping.tenant_queues t"
                    "   ON t.priority = j.priority AND t.tenant_id = j.tenant_id"
                    " WHERE j.status = 'queued' AND (f.domain IS NULL OR t.tenant_id IS NULL)"
                )
            )
        ]
        faults += [
            f"flow on {r.domain} without the domain's row"
            for r in conn.execute(
                text(
                    "SELECT DISTINCT f.domain FROM scraping.tenant_flows f"
                    " WHERE NOT EXISTS (SELECT 1 FROM scraping.domains d"
                    "                   WHERE d.domain = f.domain)"
                )
            )
        ]
        faults += [
            f"tenant {r.tenant_id} parked in {r.priority} with a flow ready"
            for r in conn.execute(
                text(
                    "SELECT DISTINCT t.priority, t.tenant_id FROM scraping.tenant_queues t"
                    " JOIN scraping.tenant_flows f"
                    "   ON f.priority = t.priority AND f.tenant_id = t.tenant_id"
                    " WHERE NOT t.ready AND f.ready"
                )
            )
        ]
    return faults


def _parked(engine: Engine, tenant_id: uuid.UUID) -> bool:
    with engine.connect() as conn:
        return not conn.execute(
            text("SELECT ready FROM scraping.tenant_queues WHERE tenant_id = :t"),
            {"t": tenant_id},
        ).scalar_one()


def _until_done_or_blocked(engine: Engine, done: threading.Event) -> None:
    """Until `done` is set or another session waits on a row's transaction: the two ways
    an operator's statement can meet a producer's open one (the condition the test goes on
    on, not a delay)."""
    deadline = time.monotonic() + 120  # a bound for a broken run only
    with engine.connect() as conn:
        while not done.is_set():
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')"
                )
            ).scalar_one()
            conn.rollback()
            if waiting:
                return
            assert time.monotonic() < deadline, "neither done nor waiting"
            time.sleep(0.01)


def _full_domain_with_a_waiting_tenant(
    engine: Engine, make_tenant
) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """FULL allows one connection; A's first job runs there and its second waits: the claim
    that meets it sets A's flow aside for a connection and parks A (nothing else to claim).
    (tenant A, the running job, the waiting job)."""
    a = make_tenant("a")[0].id
    set_domain_limits(engine, FULL, rps=None, concurrency=1)
    running = enqueue(engine, a, f"http://{FULL}/1")
    assert [j.id for j in claim(engine, 1)] == [running]
    waiting = enqueue(engine, a, f"http://{FULL}/2")
    assert claim(engine, 1) == []
    assert _parked(engine, a)
    return a, running, waiting


# --- wake paths ------------------------------------------------------------------------


@pytest.mark.parametrize("frees_it", ["outcome", "cancelled", "sweeper"])
def test_a_tenant_parked_on_a_full_domain_comes_back_when_its_running_job_leaves(
    db_engine: Engine, make_tenant, frees_it: str
) -> None:
    """A's last claimable job waits for the connection its own running job holds: the
    running job leaving `running` (its outcome, a cancel written by an operator, the
    sweeper taking its lost lease back) wakes the flow, and the next claim starts a job
    there, not a minute later."""
    a, running, waiting = _full_domain_with_a_waiting_tenant(db_engine, make_tenant)
    with db_engine.begin() as conn:
        if frees_it == "outcome":
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET status = 'succeeded', result_key = 'k',"
                    " lease_owner = NULL, lease_expires_at = NULL, finished_at = now()"
                    " WHERE id = :id"
                ),
                {"id": running},
            )
        elif frees_it == "cancelled":
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET status = 'cancelled', lease_owner = NULL,"
                    " lease_expires_at = NULL, finished_at = now() WHERE id = :id"
                ),
                {"id": running},
            )
        else:
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET lease_expires_at = now() - interval '1 s'"
                    " WHERE id = :id"
                ),
                {"id": running},
            )
    if frees_it == "sweeper":
        assert [r.id for r in leases.sweep_expired_leases(db_engine, max_attempts=5)] == [running]
    assert not _structure_faults(db_engine)
    # One connection: A's job that waited starts (a job swept back takes a new tag, behind
    # its tenant's others).
    assert [j.id for j in claim(db_engine, 2)] == [waiting]


def test_a_redirect_hops_slot_given_back_wakes_the_flows_it_kept_waiting(
    db_engine: Engine, make_tenant
) -> None:
    """FULL's one connection is held by another job's redirect hop: A's job there is set
    aside and A parked; the hop's slot given back wakes it for the next claim."""
    a = make_tenant("a")[0].id
    set_domain_limits(db_engine, FULL, rps=None, concurrency=1)
    hopper = enqueue(db_engine, a, "http://elsewhere.example/1")
    [claimed] = claim(db_engine, 1)
    with db_engine.begin() as conn:
        wait = conn.execute(
            text(f"SELECT scraping.take_redirect_slot(:id, 1, '{FULL}', 600, 10000, 10000)"),
            {"id": hopper},
        ).scalar_one()
    assert wait == 0
    waiting = enqueue(db_engine, a, f"http://{FULL}/1")
    assert claim(db_engine, 1) == []
    assert _parked(db_engine, a)
    with db_engine.begin() as conn:
        conn.execute(text("SELECT scraping.release_redirect_slot(:id, 1)"), {"id": hopper})
    assert [j.id for j in claim(db_engine, 1)] == [waiting]
    assert claimed.id == hopper


def test_an_operator_raising_a_domains_connections_while_a_claim_holds_it_wakes_its_flows(
    db_engine: Engine, make_tenant
) -> None:
    """An open claim finds FULL full and sets A's flow aside (A parked), holding FULL's row;
    the operator's `domain set --concurrency 2` waits for that claim and then wakes what it
    set aside: the next claim starts A's job."""
    a = make_tenant("a")[0].id
    set_domain_limits(db_engine, FULL, rps=None, concurrency=1)
    running = enqueue(db_engine, a, f"http://{FULL}/1")
    assert [j.id for j in claim(db_engine, 1)] == [running]
    waiting = enqueue(db_engine, a, f"http://{FULL}/2")
    raised = threading.Event()

    def raise_limit() -> None:
        set_domain_limits(db_engine, FULL, rps=None, concurrency=2)
        raised.set()

    with db_engine.connect() as claimer:
        got = claimer.execute(text("SELECT id FROM scraping.claim_jobs('w', 1, 60, 100, 10)"))
        assert got.scalars().all() == []
        operator = threading.Thread(target=raise_limit)
        operator.start()
        wait_until_blocked(db_engine, "transactionid")
        claimer.commit()
    operator.join(120)
    assert raised.is_set()
    assert not _structure_faults(db_engine)
    assert [j.id for j in claim(db_engine, 1)] == [waiting]


def test_failed_jobs_requeued_onto_a_paused_domain_start_once_an_operator_resumes_it(
    db_engine: Engine, make_tenant
) -> None:
    """The runbook requeues A's failed job while its domain is paused (the flow goes aside
    with the pause, A parked with it); the operator's resume brings both back."""
    a = make_tenant("a")[0].id
    job = enqueue(db_engine, a, "http://paused.example/1")
    assert [j.id for j in claim(db_engine, 1)] == [job]
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET status = 'failed', lease_owner = NULL,"
                " lease_expires_at = NULL, finished_at = now() WHERE id = :id"
            ),
            {"id": job},
        )
    pause_domain(db_engine, "paused.example", seconds=600, max_pause_seconds=3600)
    assert leases.requeue_failed_jobs(db_engine, [job]) == [job]
    assert claim(db_engine, 1) == []
    assert not _structure_faults(db_engine)
    assert resume_domain(db_engine, "paused.example")
    assert [j.id for j in claim(db_engine, 1)] == [job]


def test_a_domain_row_reset_by_an_operator_brings_its_parked_tenants_back(
    db_engine: Engine, make_tenant
) -> None:
    """An operator deletes a paused domain's state row (a reset: its pause and bucket go):
    the flows set aside for the pause and the tenants parked with them come back."""
    a = make_tenant("a")[0].id
    pause_domain(db_engine, "reset.example", seconds=600, max_pause_seconds=3600)
    job = enqueue(db_engine, a, "http://reset.example/1")
    assert claim(db_engine, 1) == []
    assert _parked(db_engine, a)
    with db_engine.begin() as conn:
        conn.execute(text("DELETE FROM scraping.domains WHERE domain = 'reset.example'"))
    assert not _structure_faults(db_engine)
    assert [j.id for j in claim(db_engine, 1)] == [job]


def test_a_domain_row_reset_while_a_producer_announces_its_first_job_keeps_the_job_claimable(
    db_engine: Engine, make_tenant
) -> None:
    """A domain's state row outlives its queue (its limits, its bucket). A producer's open
    transaction submits the first job there since (a new queue and flow, the row found and
    left unlocked), and an operator deletes the row meanwhile: the delete neither saw the
    producer's job (not committed) nor waited for it, so no row was made again, and the
    flow committed after it pointed at a domain without a state row — which the claim took
    for one another claim holds (before migration 0040): the job was never claimed, nor any
    later one there. The claim that meets it makes the row again."""
    a = make_tenant("a")[0].id
    set_domain_limits(db_engine, "reset.example", rps=None, concurrency=4)
    reset = threading.Event()

    def delete_row() -> None:
        with db_engine.begin() as conn:
            conn.execute(text("DELETE FROM scraping.domains WHERE domain = 'reset.example'"))
        reset.set()

    with db_engine.connect() as producer:
        job = producer.execute(
            text("SELECT scraping.submit_job(:t, 'http://reset.example/1')"), {"t": a}
        ).scalar_one()
        operator = threading.Thread(target=delete_row)
        operator.start()
        _until_done_or_blocked(db_engine, reset)
        producer.commit()
    operator.join(120)
    assert reset.is_set()
    assert [j.id for j in claim(db_engine, 1)] == [job]
    assert not _structure_faults(db_engine)


# --- a client's own transaction ----------------------------------------------------------


def _claim_within(conn: Connection, limit: int, seconds: float) -> list[uuid.UUID]:
    """One claim on `conn`, cancelled by the server if it takes more than `seconds` (a
    claim stuck on a lock fails the test rather than hanging it)."""
    with conn.begin():
        conn.execute(text(f"SET LOCAL statement_timeout = '{int(seconds * 1000)}ms'"))
        return list(
            conn.execute(
                text("SELECT id FROM scraping.claim_jobs('w', :n, 60, 10000, 10000)"),
                {"n": limit},
            )
            .scalars()
            .all()
        )


def test_a_producers_open_transaction_never_stalls_the_claims_of_other_tenants(
    db_engine: Engine, make_tenant
) -> None:
    """docs/integration.md: a producer calls scraping.submit_job in its own transaction,
    which may stay open as long as the producer's own work. Its job's announcement holds
    its tenant's row (FOR SHARE) until then. A claim that finds every tenant of a class
    with work so held waited for that row without a limit (it held no lock yet): every
    worker's claim stopped there, other classes and tenants too, until the producer
    committed — a client could stop all scraping by leaving a transaction open."""
    p, q = make_tenant("producer")[0].id, make_tenant("other")[0].id
    enqueue(db_engine, p, "http://p-old.example/1", priority="high")
    others = enqueue(db_engine, q, "http://q.example/1", priority="normal")
    with db_engine.connect() as producer, db_engine.connect() as claimer:
        producer.execute(
            text("SELECT scraping.submit_job(:t, 'http://p-new.example/1', p_priority => 'high')"),
            {"t": p},
        )
        try:
            got = _claim_within(claimer, 2, seconds=10)
        finally:
            producer.rollback()
    assert others in got


def test_a_claim_and_a_producer_crossing_on_a_tenant_and_a_flow_both_end(
    db_engine: Engine, make_tenant
) -> None:
    """The cycle the claim's bounded wait is for: a producer's open transaction holds B's
    row (its job announced on a new domain); a claim meets A's job on a full domain and sets
    aside every ready flow there, B's among them (holding it), then, every tenant with work
    held, waits for B's row; the producer then announces a job to that flow and waits for
    the claim. The claim gives up its wait (half a second) and ends, the producer goes on,
    and B's jobs are claimable afterwards: no error, no stall, nobody left parked."""
    a, b, c = (make_tenant(n)[0].id for n in ("a", "b", "c"))
    set_domain_limits(db_engine, FULL, rps=None, concurrency=1)
    enqueue(db_engine, c, f"http://{FULL}/c")
    assert len(claim(db_engine, 1)) == 1  # FULL's one connection taken
    enqueue(db_engine, a, f"http://{FULL}/a")
    enqueue(db_engine, b, f"http://{FULL}/b")
    b_old = enqueue(db_engine, b, "http://b-old.example/1")
    outcome: dict[str, object] = {}

    def claim_in_thread() -> None:
        try:
            with db_engine.begin() as conn:
                outcome["claimed"] = (
                    conn.execute(text("SELECT id FROM scraping.claim_jobs('w', 4, 60, 100, 10)"))
                    .scalars()
                    .all()
                )
        except BaseException as e:  # noqa: BLE001 - asserted below
            outcome["error"] = e

    with db_engine.connect() as producer:
        b_new = producer.execute(
            text("SELECT scraping.submit_job(:t, 'http://b-new.example/1')"), {"t": b}
        ).scalar_one()
        claimer = threading.Thread(target=claim_in_thread)
        claimer.start()
        wait_until_blocked(db_engine, "transactionid")  # the claim waits for B's row
        # its announcement waits for the flow the claim set aside, unless the claim ended
        producer.execute(text(f"SELECT scraping.submit_job(:t, 'http://{FULL}/b2')"), {"t": b})
        producer.commit()
    claimer.join(120)
    assert not claimer.is_alive()
    assert "error" not in outcome, outcome
    assert outcome["claimed"] == []
    assert not _structure_faults(db_engine)
    assert sorted(str(j.id) for j in claim(db_engine, 4)) == sorted(str(i) for i in (b_old, b_new))


def test_flows_waking_for_a_tenant_a_producer_holds_do_not_keep_others_asleep(
    db_engine: Engine, make_tenant
) -> None:
    """A claim wakes at most 1,000 flows whose wait is over, oldest wake first, and only
    those whose tenant row it can take. H has 1,000 flows waking first; its producer's open
    transaction holds H's row. V's flow wakes just after them: the claim took H's 1,000,
    could wake none, and never reached V's — V's due job waited as long as H's producer
    kept its transaction open."""
    h, v = make_tenant("hostile")[0].id, make_tenant("victim")[0].id
    with db_engine.begin() as conn:
        due = conn.execute(text("SELECT now() + interval '1 second'")).scalar_one()
        conn.execute(
            text(
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                " next_attempt_at)"
                " SELECT gen_random_uuid(), :t, 'http://h-' || g || '.example/',"
                "        'h-' || g || '.example', 'normal', :due"
                " FROM generate_series(1, 1000) AS g"
            ),
            {"t": h, "due": due},
        )
    with db_engine.begin() as conn:
        victim = conn.execute(
            text(
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                " next_attempt_at) VALUES (gen_random_uuid(), :t, 'http://v.example/',"
                " 'v.example', 'normal', :due + interval '1 ms') RETURNING id"
            ),
            {"t": v, "due": due},
        ).scalar_one()
    with db_engine.connect() as producer, db_engine.connect() as claimer:
        producer.execute(text("SELECT scraping.submit_job(:t, 'http://h-new.example/1')"), {"t": h})
        # every flow's wait is over (the database's clock, not this process's)
        while not claimer.execute(
            text("SELECT now() > :due + interval '10 ms'"), {"due": due}
        ).scalar_one():
            claimer.rollback()
            time.sleep(0.05)
        claimer.rollback()
        try:
            got = _claim_within(claimer, 1, seconds=10)
        finally:
            producer.rollback()
    assert got == [victim]


# --- fairness --------------------------------------------------------------------------


def test_a_weight_changed_between_claims_applies_from_the_next_start_within_the_bound(
    db_engine: Engine, make_tenant
) -> None:
    """Two tenants with work throughout; A's weight goes from 1 to 3 between two claims:
    the second claim's starts hold |n_a/3 - n_b/1| <= 1/3 + 1."""
    a_tenant = make_tenant("a")[0]
    a, b = a_tenant.id, make_tenant("b")[0].id
    for tenant, name in ((a, "a"), (b, "b")):
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                    " next_attempt_at)"
                    " SELECT gen_random_uuid(), :t, 'http://' || :n || '-' || g || '.example/',"
                    "        :n || '-' || g || '.example', 'normal', now() - interval '1 h'"
                    " FROM generate_series(1, 40) AS g"
                ),
                {"t": tenant, "n": name},
            )
    first = Counter(j.tenant_id for j in claim(db_engine, 10))
    assert abs(first[a] - first[b]) <= 2, first
    set_tenant_weight(db_engine, "a", 3)
    second = Counter(j.tenant_id for j in claim(db_engine, 16))
    assert abs(second[a] / 3 - second[b]) <= 1 / 3 + 1, second
