"""A pause racing a resume of its host, and another pause: found by a hostile review of
0048's first form (a pause locked its host's queue rows and flows in key order before the
host's row, deciding on an unlocked read; a resume still took the host's row first). Both
deadlocked; both pass now that the decision is read under KEY SHARE and a resume takes the
rows as a pause does (scraping.lock_domain_rows). Windows are forced with locks held open
and waits seen in pg_blocking_pids, never by sleeping."""

from __future__ import annotations

import threading

import psycopg
from sqlalchemy import Engine, text

from pin_orchestration.migrations.schema_dump import libpq_url
from tests.scraping.test_round_pauses_attack import _until_waiting

GATE_SECONDS = 30


def _two_queues_paused(db_engine: Engine, tenant) -> None:
    """d.example: a queue row per class, normal's made first (earlier in the heap, so the
    trigger's scan meets it first), high's second (first in key order); paused 20 minutes."""
    with db_engine.begin() as conn:
        for priority in ("normal", "high"):
            conn.execute(
                text(
                    "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                    " next_attempt_at) VALUES (gen_random_uuid(), :u, 'http://d.example/' ||"
                    " :p, 'd.example', :p, now() - interval '1 hour')"
                ),
                {"u": tenant, "p": priority},
            )
        conn.execute(
            text("SELECT scraping.pause_domain('d.example', now() + interval '20 minutes')")
        )
        rows = conn.execute(
            text(
                "SELECT priority, ready, waiting_for FROM scraping.domain_queues"
                " WHERE domain = 'd.example' ORDER BY ctid"
            )
        ).all()
    assert [r.priority for r in rows] == ["normal", "high"], rows
    assert all(not r.ready and r.waiting_for == "room" for r in rows), rows


def test_a_pause_racing_a_resume_does_not_deadlock_with_another_pause(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """d.example is paused 20 minutes; u's flow there set aside with it, g's ready (a flow
    whose intake read the host's row before the pause committed: the next claim sets it
    aside). A producer's transaction holds g's flow (an intake's upsert, open). An operator
    resumes d.example (transaction open: it holds the host's row and the queue rows and
    u's flow it woke; g's, ready, it leaves). Worker A reports a 429 for 10 minutes:
    pause_domain's NOT EXISTS sees the committed 20-minute pause (>= 10 min), so it locks
    nothing first, and its upsert waits for the host's row behind the resume. Worker B
    reports 30 minutes: it would lengthen, so it pre-locks high's queue row (waiting
    behind the resume). The resume commits: B takes high's and normal's queue rows and
    waits for g's flow (the producer); A's upsert re-reads blocked_until = NULL, sets 10
    minutes (a change: the trigger fires) and, holding the host's row, waits for normal's
    queue row (B). The producer commits: B takes the flows and waits for the host's row
    (A): a deadlock, one pause killed (a round's pauses fail, its outcomes not written)."""
    u = make_tenant("u")[0].id
    g = make_tenant("g")[0].id
    _two_queues_paused(db_engine, u)
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                " next_attempt_at) VALUES (gen_random_uuid(), :g, 'http://d.example/g',"
                " 'd.example', 'normal', now() - interval '1 hour')"
            ),
            {"g": g},
        )
        conn.execute(
            text(
                "UPDATE scraping.tenant_flows SET ready = true, waiting_for = NULL,"
                " wake_at = NULL WHERE domain = 'd.example' AND tenant_id = :g"
            ),
            {"g": g},
        )
    url = libpq_url(db_url)
    errors: dict[str, BaseException] = {}

    def pause(conn: psycopg.Connection, name: str, minutes: int) -> None:
        try:
            conn.execute(
                "SELECT scraping.pause_domain('d.example',"
                " now() + make_interval(mins => %s)) /* " + name + " */",
                (minutes,),
            )
            conn.commit()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors[name] = e
            conn.rollback()

    def resume_host(conn: psycopg.Connection) -> None:
        try:
            conn.execute("SELECT scraping.resume_domain('d.example') /* resume */")
            conn.commit()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors["resume"] = e
            conn.rollback()

    with (
        psycopg.connect(url) as producer,
        psycopg.connect(url) as resume,
        psycopg.connect(url) as a,
        psycopg.connect(url) as b,
        psycopg.connect(url, autocommit=True) as watch,
    ):
        producer.execute(
            "SELECT 1 FROM scraping.tenant_flows WHERE domain = 'd.example'"
            " AND tenant_id = %s FOR NO KEY UPDATE",
            (g,),
        )
        ppid = producer.info.backend_pid
        # The resume takes the host's rows in key order before the host's own row: it
        # waits for the producer's flow holding none of the host's row (its first form
        # held the host's row and left g's flow, so the pauses below met it in turn).
        tr = threading.Thread(target=resume_host, args=(resume,))
        tr.start()
        _until_waiting(watch, ppid, "resume", tr)
        # A's 10 minutes change nothing while the 20-minute pause stands: read under KEY
        # SHARE (no resume holds the host's row yet), it commits without waiting.
        ta = threading.Thread(target=pause, args=(a, "pause_a", 10))
        ta.start()
        ta.join(GATE_SECONDS)
        assert not ta.is_alive(), "pause A waited"
        # B's 30 minutes lengthen: it takes the queue rows in key order, behind the resume.
        tb = threading.Thread(target=pause, args=(b, "pause_b", 30))
        tb.start()
        _until_waiting(watch, resume.info.backend_pid, "pause_b", tb)
        producer.commit()
        tr.join(60)
        tb.join(60)
        assert not tr.is_alive() and not tb.is_alive()
    assert not errors, {k: str(v) for k, v in errors.items()}
    with db_engine.connect() as conn:
        kept = conn.execute(
            text(
                "SELECT blocked_until > now() + interval '29 minutes' FROM scraping.domains"
                " WHERE domain = 'd.example'"
            )
        ).scalar_one()
    assert kept


def test_a_lengthening_pause_does_not_deadlock_with_a_resume_of_its_host(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """d.example is paused 20 minutes, its queue rows and u's flow set aside. A producer's
    transaction holds u's flow (an intake's upsert, open). Worker B reports a 429 for 30
    minutes: it would lengthen, so it pre-locks high's and normal's queue rows and waits
    for u's flow. An operator resumes d.example: resume_domain locks the host's row (FOR
    UPDATE), clears blocked_until, and its trigger wakes the queue rows, waiting for B's.
    The producer commits: B takes the flow and waits for the host's row (the resume's): a
    deadlock, one of them killed. Before 0048 both took the host's row first and queued
    there. The same holds for set_domain_limits and robots_crawl_delay, whose triggers
    also touch the queue rows with the host's row held."""
    u = make_tenant("u")[0].id
    _two_queues_paused(db_engine, u)
    url = libpq_url(db_url)
    errors: dict[str, BaseException] = {}

    def run(conn: psycopg.Connection, name: str, sql: str) -> None:
        try:
            conn.execute(sql + " /* " + name + " */")
            conn.commit()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors[name] = e
            conn.rollback()

    with (
        psycopg.connect(url) as producer,
        psycopg.connect(url) as b,
        psycopg.connect(url) as op,
        psycopg.connect(url, autocommit=True) as watch,
    ):
        producer.execute(
            "SELECT 1 FROM scraping.tenant_flows WHERE domain = 'd.example'"
            " AND tenant_id = %s FOR NO KEY UPDATE",
            (u,),
        )
        tb = threading.Thread(
            target=run,
            args=(
                b,
                "pause_b",
                "SELECT scraping.pause_domain('d.example', now() + interval '30 minutes')",
            ),
        )
        tb.start()
        _until_waiting(watch, producer.info.backend_pid, "pause_b", tb)
        tr = threading.Thread(
            target=run, args=(op, "resume_op", "SELECT scraping.resume_domain('d.example')")
        )
        tr.start()
        _until_waiting(watch, b.info.backend_pid, "resume_op", tr)
        producer.commit()
        tb.join(60)
        tr.join(60)
        assert not tb.is_alive() and not tr.is_alive()
    assert not errors, {k: str(v) for k, v in errors.items()}
