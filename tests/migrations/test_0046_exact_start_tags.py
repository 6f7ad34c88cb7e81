"""Migration 0046 makes the tenants' start tags and the class start clock numeric on a
database with a history: every tag and clock a running queue has reached is carried
exactly (as the very double it was, so tags that differ only past a double's 15th digit stay
apart and in order), the clock slots each keep their own clocks, down gives back the same
doubles, and up again the same numerics."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
from alembic import command
from sqlalchemy import Engine, create_engine, text

from pin_orchestration.migrations import alembic_config
from pin_orchestration.migrations.schema_dump import libpq_url
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.leases import AttemptOutcome, ClaimedJob
from pin_orchestration.scraping.store.tenancy import create_tenant, set_tenant_weight
from pin_orchestration.scraping.worker.run import claim_due_jobs
from tests.scraping.conftest import UNLIMITED

BIG = 2.0**44
# start tags in class normal, tenant name -> tag: neighbours a plain ::numeric (15 digits)
# would make equal, tiny and huge ones
TAGS = {
    "t0": 0.0,
    "t1": 0.3,
    "t2": 0.1 + 0.2,  # 0.30000000000000004
    "t3": BIG,
    "t4": math.nextafter(BIG, math.inf),  # 2**44 + 2**-8
    "t5": BIG + 1000.0,
    "t6": 1e300,
    "t7": math.nextafter(1e300, math.inf),
}
PARKED = {"t3", "t6"}
# start clocks (high, normal, low) per slot: claims left some slots behind in some class
SLOTS = {
    0: [1.5, BIG, 0.0],
    3: [2.5, math.nextafter(BIG, math.inf), 0.1 + 0.2],
    6: [2.0, 7.0, 0.3],
}


def _start_tags(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT n.name, t.start_tag FROM scraping.tenant_queues t"
                " JOIN scraping.tenants n ON n.id = t.tenant_id"
            )
        ).all()
    return {r.name: r.start_tag for r in rows}


def _order(engine: Engine) -> list[list[str]]:
    """The tenants in the pick's order (start tag, then id), ties grouped."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT array_agg(n.name ORDER BY n.name) AS names"
                " FROM scraping.tenant_queues t JOIN scraping.tenants n ON n.id = t.tenant_id"
                " GROUP BY t.start_tag ORDER BY t.start_tag"
            )
        ).all()
    return [list(r.names) for r in rows]


def _slot_column(engine: Engine) -> str:
    """The slots' start clock column: start_clock before 0046, exact_start_clock from it
    (renamed, so a claim compiled before the migration fails at its write)."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT attname FROM pg_attribute WHERE attrelid ="
                " 'scraping.pick_class_clocks'::regclass AND attname LIKE '%start_clock'"
            )
        ).scalar_one()


def _clocks(engine: Engine) -> tuple[dict[int, list[object]], dict[str, object]]:
    column = _slot_column(engine)
    with engine.connect() as conn:
        slots = {
            r.slot: list(r.clock)
            for r in conn.execute(
                text(f"SELECT slot, {column} AS clock FROM scraping.pick_class_clocks")
            )
        }
        view = {
            r.priority: r.start_clock
            for r in conn.execute(text("SELECT priority, start_clock FROM scraping.class_clocks"))
        }
    return slots, view


def _types(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                text(
                    "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
                    " WHERE (a.attrelid, a.attname) IN ("
                    "   ('scraping.tenant_queues'::regclass, 'start_tag'),"
                    "   ('scraping.pick_class_clocks'::regclass, 'start_clock'),"
                    "   ('scraping.pick_class_clocks'::regclass, 'exact_start_clock'),"
                    "   ('scraping.class_clocks'::regclass, 'start_clock'))"
                )
            ).scalars()
        )


def test_0046_carries_start_tags_and_clocks_exactly_and_back(empty_db_url: str) -> None:
    config = alembic_config(empty_db_url)
    command.upgrade(config, "0045")
    engine = create_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            for name, tag in TAGS.items():
                tenant = conn.execute(
                    text(
                        "INSERT INTO scraping.tenants"
                        " (id, name, api_key_sha256, api_key_prefix, weight) VALUES"
                        " (gen_random_uuid(), :n, sha256(convert_to(:n, 'UTF8')), :n, 1)"
                        " RETURNING id"
                    ),
                    {"n": name},
                ).scalar_one()
                conn.execute(
                    text(
                        "INSERT INTO scraping.tenant_queues (priority, tenant_id, start_tag,"
                        " ready) VALUES ('normal', :t, :s, :r)"
                    ),
                    {"t": tenant, "s": tag, "r": name not in PARKED},
                )
            for slot, clocks in SLOTS.items():
                conn.execute(
                    text("UPDATE scraping.pick_class_clocks SET start_clock = :c WHERE slot = :s"),
                    {"c": clocks, "s": slot},
                )
        order = [[n] for n in sorted(TAGS, key=TAGS.__getitem__)]
        assert _order(engine) == order, "every tag distinct before"
        slots_before, view_before = _clocks(engine)
        assert view_before["normal"] == math.nextafter(BIG, math.inf)

        command.upgrade(config, "0046")
        assert _slot_column(engine) == "exact_start_clock"
        assert _types(engine) == {"numeric", "numeric[]"}
        tags = _start_tags(engine)
        assert all(isinstance(t, Decimal) for t in tags.values())
        assert {n: float(t) for n, t in tags.items()} == TAGS, "each tag is its double"
        assert tags["t4"] - tags["t3"] == Decimal("0.004"), "the shortest digits, exact"
        assert _order(engine) == order, "still distinct, in the same order"
        slots, view = _clocks(engine)
        assert {s: [float(c) for c in cs] for s, cs in slots.items()} == slots_before
        assert {p: float(c) for p, c in view.items()} == view_before
        assert view["normal"] == max(c[1] for c in slots.values())
        # exact from here: a weight-1000 step at 2**44, lost in a double, is kept
        with engine.connect() as conn:
            stepped = conn.execute(
                text(
                    "SELECT start_clock + 0.001 > start_clock FROM scraping.class_clocks"
                    " WHERE priority = 'normal'"
                )
            ).scalar_one()
        assert stepped

        command.downgrade(config, "0045")
        assert _slot_column(engine) == "start_clock"
        assert _types(engine) == {"double precision", "double precision[]"}
        assert _start_tags(engine) == TAGS, "down gives back the very doubles"
        assert _order(engine) == order
        assert _clocks(engine) == (slots_before, view_before)

        command.upgrade(config, "0046")
        assert _start_tags(engine) == tags
        assert _clocks(engine) == (slots, view)
        assert _order(engine) == order
    finally:
        engine.dispose()


# --- 0046 on a live database: workers claiming and writing outcomes while it runs ---

GATE_SECONDS = 30


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    """A gate on a state PostgreSQL reports (a lock wait), polled; never a fixed sleep."""
    deadline = time.monotonic() + GATE_SECONDS
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gate never opened: {what}")
        time.sleep(0.02)


def _waiting(
    admin: psycopg.Connection, *, pid: int | None = None, relation: str | None = None
) -> bool:
    return bool(
        admin.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted"
            " AND (%(pid)s::int IS NULL OR pid = %(pid)s::int)"
            " AND (%(rel)s::text IS NULL OR relation = %(rel)s::text::regclass)",
            {"pid": pid, "rel": relation},
        ).fetchone()[0]
    )


def _queue(engine: Engine, tenant_id: object, domain: str, n: int = 1) -> None:
    with engine.begin() as conn:
        for i in range(n):
            conn.execute(
                text(
                    "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority,"
                    " next_attempt_at) VALUES (gen_random_uuid(), :t, :u, :d, 'normal',"
                    " now() - interval '1 hour')"
                ),
                {"t": tenant_id, "u": f"http://{domain}/{i}", "d": domain},
            )


def _claim(engine: Engine, limit: int) -> list[ClaimedJob]:
    return claim_due_jobs(
        engine, worker="w", limit=limit, lease_seconds=600, domain_defaults=UNLIMITED
    )


def test_0046_waits_out_a_transaction_that_pauses_a_host_and_then_hands_back_a_job(
    empty_db_url: str,
) -> None:
    """A transaction that pauses a host (its trigger parks tenants: tenant_queues) and then
    hands a job back (its fair tag reads class_clocks) takes the two in the order opposite
    to a claim's. 0046 took the view and then waited for tenant_queues: the deadlock
    detector failed the migration (found by a hostile review, with a worker's round, which
    was such a transaction until its pauses got transactions of their own). 0046 now takes
    the three together, holding none while it waits, and both go through."""
    config = alembic_config(empty_db_url)
    command.upgrade(config, "0045")
    engine = create_engine(empty_db_url)
    admin = psycopg.connect(libpq_url(empty_db_url), autocommit=True)
    migration_error: list[BaseException] = []
    try:
        tenant, _ = create_tenant(engine, "t")
        _queue(engine, tenant.id, "b.example")
        # another tenant's flow on the paused host, so its pause has a tenant to park
        other, _ = create_tenant(engine, "u")
        _queue(engine, other.id, "a.example")
        b = next(j for j in _claim(engine, 2) if j.domain == "b.example")

        def migrate() -> None:
            try:
                command.upgrade(config, "0046")
            except BaseException as exc:  # reported on the main thread
                migration_error.append(exc)

        migration = threading.Thread(target=migrate)
        hand_back = AttemptOutcome(
            job_id=b.id,
            attempt=b.attempt,
            status="queued",
            outcome="retry",
            next_attempt_at=datetime.now(UTC),
            job_domain="b.example",
        )
        with engine.begin() as conn:
            conn.execute(text("SELECT scraping.pause_domain('a.example', now() + interval '60 s')"))
            migration.start()
            _wait_for(
                lambda: _waiting(admin, relation="scraping.tenant_queues"),
                "0046 waiting for tenant_queues",
            )
            leases._finish_attempts(conn, "w", [hand_back], lambda o, m: None)
        migration.join(GATE_SECONDS)
        assert not migration.is_alive()
        assert not migration_error, f"0046 failed: {migration_error[0]!r}"
        with engine.connect() as conn:
            status = conn.execute(
                text("SELECT status FROM scraping.jobs WHERE id = :i"), {"i": b.id}
            ).scalar_one()
        assert status == "queued", "the hand-back is written"
        assert _slot_column(engine) == "exact_start_clock"
    finally:
        admin.close()
        engine.dispose()


CLOCK_2_60 = 2.0**60  # clocks a pre-0044 history (weights below 0.001) reached


def test_a_claim_called_while_0046_commits_fails_rather_than_round_the_clock(
    empty_db_url: str,
) -> None:
    """A claim called while 0046 holds its locks runs 0045's body (PL/pgSQL compiles a
    function when it is called): after the commit it read the numeric clocks into doubles
    and wrote them back rounded to 15 digits, at 2**60 the class clock 3,024 past every
    tag, and a weight-1000 tenant arriving there got none of the next 15 picks (found by a
    hostile review). The slots' column is renamed by 0046, so that claim fails at its write
    (one statement: nothing it picked is kept) and the worker's next claim is 0046's. The
    gate: a row lock on pin.alembic_version holds 0046 after its DDL, before its commit."""
    config = alembic_config(empty_db_url)
    command.upgrade(config, "0045")
    engine = create_engine(empty_db_url)
    url = libpq_url(empty_db_url)
    admin = psycopg.connect(url, autocommit=True)
    version_holder = psycopg.connect(url)
    claimer = psycopg.connect(url, autocommit=True)
    errors: list[BaseException] = []
    claim_errors: list[BaseException] = []
    try:
        ids = {}
        for name in ("a", "b"):
            ids[name] = create_tenant(engine, name)[0].id
            set_tenant_weight(engine, name, 1000.0)
            _queue(engine, ids[name], f"{name}.example", 20)
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE scraping.tenant_queues SET start_tag = :c"), {"c": CLOCK_2_60}
            )
            conn.execute(
                text("UPDATE scraping.pick_class_clocks SET start_clock = ARRAY[:c, :c, :c]"),
                {"c": CLOCK_2_60},
            )
        version_holder.execute("SELECT 1 FROM pin.alembic_version FOR UPDATE")

        def migrate() -> None:
            try:
                command.upgrade(config, "0046")
            except BaseException as exc:  # reported on the main thread
                errors.append(exc)

        def claim() -> None:
            try:
                claimer.execute("SELECT id FROM scraping.claim_jobs('w', 4, 600, 10000, 10000)")
            except BaseException as exc:
                claim_errors.append(exc)

        migration = threading.Thread(target=migrate)
        migration.start()
        # 0046's DDL is done and its locks held: it waits to write its version
        _wait_for(
            lambda: (
                _waiting(admin, relation="pin.alembic_version")
                or bool(
                    admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND wait_event = 'transactionid' AND query LIKE '%alembic_version%'"
                    ).fetchone()[0]
                )
            ),
            "0046 waiting to write its version",
        )
        claiming = threading.Thread(target=claim)
        claiming.start()
        claimer_pid = claimer.info.backend_pid
        _wait_for(lambda: _waiting(admin, pid=claimer_pid), "the claim waiting for 0046")
        version_holder.rollback()
        migration.join(GATE_SECONDS)
        claiming.join(GATE_SECONDS)
        assert not errors, errors
        assert [type(e) for e in claim_errors] == [psycopg.errors.UndefinedColumn], claim_errors

        with engine.connect() as conn:
            running = conn.execute(
                text("SELECT count(*) FROM scraping.jobs WHERE status <> 'queued'")
            ).scalar_one()
            clock = conn.execute(
                text("SELECT start_clock FROM scraping.class_clocks WHERE priority = 'normal'")
            ).scalar_one()
        assert running == 0, "nothing the failed claim picked is kept"
        # the history's double, carried as its shortest digits (1152921504606847000)
        assert clock == Decimal(repr(CLOCK_2_60)), clock
        # the next claim is 0046's: a tenant arriving at the clock shares the picks
        c = create_tenant(engine, "c")[0].id
        set_tenant_weight(engine, "c", 1000.0)
        _queue(engine, c, "c.example", 20)
        picked = Counter(j.tenant_id for j in _claim(engine, 15))
        assert picked[c] >= 4, picked
    finally:
        for conn in (claimer, version_holder, admin):
            conn.close()
        engine.dispose()
