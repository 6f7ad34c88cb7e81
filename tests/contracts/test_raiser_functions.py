"""The raising contract (issue 12): the SQL functions other services call, from a role that
has EXECUTE on them and nothing else, in transactions that also write rows of their own."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from pin_orchestration.chessboard.queue import RecalcTriggerReason, request_project_recalc
from pin_orchestration.coordination.raisers import RaiserRoleError, grant_raiser
from pin_orchestration.news.snapshot_detach.outbox import enqueue_snapshot_detach
from pin_orchestration.news.snapshot_detach.policy import Reason
from tests.test_cli import pin

RECALC = "SELECT chessboard.request_project_recalc(:p, :t, :r)"
DETACH = "SELECT news.enqueue_snapshot_detach(:s, :p, :r)"
# Advisory lock key a test trigger waits on, to hold a statement between two others.
PAUSE_KEY = 812_012


@dataclass(frozen=True)
class Raiser:
    role: str
    engine: Engine


@pytest.fixture
def raiser(db_url: str, db_engine: Engine, admin_engine: Engine) -> Iterator[Raiser]:
    """A login role granted by `grant_raiser` only, plus a schema of its own (the other
    service's tables). Its name needs quoting, so the grant's quoting is exercised."""
    role = f"Raiser {uuid.uuid4().hex[:10]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
    try:
        grant_raiser(db_engine, role)
        with db_engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA raiser_app AUTHORIZATION "{role}"'))
        engine = create_engine(make_url(db_url).set(username=role, password=None))
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE raiser_app.orders (id uuid PRIMARY KEY)"))
        yield Raiser(role, engine)
        engine.dispose()
    finally:
        with db_engine.begin() as conn:
            conn.execute(text("DROP SCHEMA IF EXISTS raiser_app CASCADE"))
            conn.execute(text(f'DROP OWNED BY "{role}"'))
        db_engine.dispose()
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP ROLE "{role}"'))


def queue_row(engine: Engine, project_id: uuid.UUID) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT * FROM chessboard.project_recalc_requests WHERE project_id = :p"),
            {"p": project_id},
        ).first()
    return dict(row._mapping) if row else None


def outbox_rows(engine: Engine, snapshot_id: uuid.UUID) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT * FROM news.snapshot_detach_outbox WHERE snapshot_id = :s "
                "ORDER BY created_at, id"
            ),
            {"s": snapshot_id},
        )
        return [dict(r._mapping) for r in rows]


def tx_now(conn: Connection) -> datetime:
    return conn.execute(text("SELECT now()")).scalar_one()


def own_row(conn: Connection) -> uuid.UUID:
    order = uuid.uuid4()
    conn.execute(text("INSERT INTO raiser_app.orders (id) VALUES (:id)"), {"id": order})
    return order


def order_exists(raiser: Raiser, order: uuid.UUID) -> bool:
    with raiser.engine.connect() as conn:
        found = conn.execute(text("SELECT 1 FROM raiser_app.orders WHERE id = :id"), {"id": order})
        return found.first() is not None


def move_first_request_back(engine: Engine, project_id: uuid.UUID, seconds: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE chessboard.project_recalc_requests "
                "SET first_requested_at = first_requested_at - make_interval(secs => :s) "
                "WHERE project_id = :p"
            ),
            {"s": seconds, "p": project_id},
        )


# --- the debounce and the cap, raised by a role with EXECUTE only -----------------------------


def test_raiser_queues_with_debounce_and_cap_in_its_own_transaction(
    raiser: Raiser, db_engine: Engine
) -> None:
    project, tenant = uuid.uuid4(), uuid.uuid4()
    with raiser.engine.begin() as conn:
        order = own_row(conn)
        first_due = conn.execute(text(RECALC), {"p": project, "t": tenant, "r": "Crud"}).scalar()
        first_at = tx_now(conn)
    assert first_due == first_at + timedelta(seconds=30)
    assert order_exists(raiser, order)
    row = queue_row(db_engine, project)
    assert row is not None
    assert (row["due_at"], row["first_requested_at"], row["requested_count"]) == (
        first_due,
        first_at,
        1,
    )
    assert (row["tenant_id"], row["last_reason"], row["attempt_count"]) == (tenant, "Crud", 0)

    # Trailing: a further request moves the due time to its own time + 30 s.
    with raiser.engine.begin() as conn:
        own_row(conn)
        second_due = conn.execute(
            text(RECALC), {"p": project, "t": tenant, "r": "LayoutChanged"}
        ).scalar()
        second_at = tx_now(conn)
    assert second_due == second_at + timedelta(seconds=30)
    row = queue_row(db_engine, project)
    assert row is not None
    assert (row["first_requested_at"], row["requested_count"], row["last_reason"]) == (
        first_at,
        2,
        "LayoutChanged",
    )

    # Capped: never past first_requested_at + 5 min, however often the project is touched.
    move_first_request_back(db_engine, project, 290)
    with raiser.engine.begin() as conn:
        capped_due = conn.execute(text(RECALC), {"p": project, "t": tenant, "r": "Crud"}).scalar()
        capped_at = tx_now(conn)
    row = queue_row(db_engine, project)
    assert row is not None
    assert capped_due == row["first_requested_at"] + timedelta(minutes=5)
    assert capped_due < capped_at + timedelta(seconds=30)
    assert (row["due_at"], row["requested_count"]) == (capped_due, 3)


def test_raiser_has_no_other_privilege(raiser: Raiser) -> None:
    forbidden = [
        "SELECT * FROM chessboard.project_recalc_requests",
        "SELECT * FROM news.snapshot_detach_outbox",
        "DELETE FROM chessboard.project_recalc_requests",
        # The clock-and-policy variant runs with the caller's privileges: none on the queue.
        "SELECT chessboard.request_project_recalc_at(gen_random_uuid(), gen_random_uuid(), "
        "'Crud', now() + interval '1 year', 1, 1)",
    ]
    for statement in forbidden:
        with pytest.raises(DBAPIError) as caught, raiser.engine.begin() as conn:
            conn.execute(text(statement))
        assert caught.value.orig.sqlstate == "42501", statement  # insufficient_privilege


def test_rollback_of_the_raisers_transaction_leaves_nothing(
    raiser: Raiser, db_engine: Engine
) -> None:
    project, snapshot = uuid.uuid4(), uuid.uuid4()
    with raiser.engine.connect() as conn:
        transaction = conn.begin()
        order = own_row(conn)
        conn.execute(text(RECALC), {"p": project, "t": uuid.uuid4(), "r": "Crud"})
        conn.execute(text(DETACH), {"s": snapshot, "p": uuid.uuid4(), "r": "PostDeleted"})
        transaction.rollback()
    assert not order_exists(raiser, order)
    assert queue_row(db_engine, project) is None
    assert outbox_rows(db_engine, snapshot) == []


def test_raiser_enqueues_a_detach_once_per_active_snapshot(
    raiser: Raiser, db_engine: Engine
) -> None:
    snapshot, post = uuid.uuid4(), uuid.uuid4()
    with raiser.engine.begin() as conn:
        own_row(conn)
        first = conn.execute(text(DETACH), {"s": snapshot, "p": post, "r": "BlockReplaced"})
        first_id = first.scalar()
        again = conn.execute(text(DETACH), {"s": snapshot, "p": post, "r": "PostDeleted"})
        assert again.scalar() == first_id
        created_at = tx_now(conn)
    assert first_id.version == 7
    [row] = outbox_rows(db_engine, snapshot)
    assert (row["id"], row["status"], row["attempts"], row["reason"]) == (
        first_id,
        "Pending",
        0,
        "BlockReplaced",
    )
    assert row["next_attempt_at"] == row["created_at"] == created_at


# --- the Python helpers are thin calls of the same SQL -----------------------------------------


def _normalised_request(due: datetime, at: datetime, row: dict[str, Any]) -> tuple[Any, ...]:
    """A request's outcome without the clock: trailing (due 30 s after the request) or
    capped (due at first_requested_at + cap), and the row's other columns."""
    if due - at == timedelta(seconds=30):
        timing = "trailing 30 s"
    else:
        timing = f"capped at first + {due - row['first_requested_at']}"
    return (
        timing,
        row["due_at"] == due,
        row["requested_count"],
        row["last_reason"],
        row["attempt_count"],
        row["last_error"],
    )


def test_python_and_sql_raisers_give_identical_results(raiser: Raiser, db_engine: Engine) -> None:
    """The same requests through `request_project_recalc` (Python, as the owner) and through
    the SQL function (as the raiser) leave the same queue rows, relative to their clocks."""
    tenant = uuid.uuid4()
    by_python, by_sql = uuid.uuid4(), uuid.uuid4()

    def python_request(reason: str) -> tuple[datetime, datetime]:
        with db_engine.begin() as conn:
            return request_project_recalc(conn, by_python, tenant, reason), tx_now(conn)

    def sql_request(reason: str) -> tuple[datetime, datetime]:
        with raiser.engine.begin() as conn:
            due = conn.execute(text(RECALC), {"p": by_sql, "t": tenant, "r": reason}).scalar()
            return due, tx_now(conn)

    outcomes: dict[str, list[tuple[Any, ...]]] = {"python": [], "sql": []}
    for name, project, request in (
        ("python", by_python, python_request),
        ("sql", by_sql, sql_request),
    ):
        for step, reason in enumerate(["Crud", "PropertyObjectPriceChanged", "TalentSync"]):
            if step == 2:
                move_first_request_back(db_engine, project, 295)
            due, at = request(reason)
            row = queue_row(db_engine, project)
            assert row is not None
            outcomes[name].append(_normalised_request(due, at, row))
    assert outcomes["python"] == outcomes["sql"]
    assert [o[:3] for o in outcomes["sql"]] == [
        ("trailing 30 s", True, 1),
        ("trailing 30 s", True, 2),
        ("capped at first + 0:05:00", True, 3),
    ]

    snapshot_py, snapshot_sql, post = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with db_engine.begin() as conn:
        py_first = enqueue_snapshot_detach(conn, snapshot_py, post, Reason.POST_DELETED)
        py_again = enqueue_snapshot_detach(conn, snapshot_py, post, Reason.BLOCK_REPLACED)
    with raiser.engine.begin() as conn:
        sql_first = conn.execute(text(DETACH), {"s": snapshot_sql, "p": post, "r": "PostDeleted"})
        sql_first_id = sql_first.scalar()
        sql_again = conn.execute(text(DETACH), {"s": snapshot_sql, "p": post, "r": "BlockReplaced"})
        sql_again_id = sql_again.scalar()
    assert py_first == py_again and sql_first_id == sql_again_id

    def shape(row: dict[str, Any]) -> tuple[Any, ...]:
        return (
            row["id"].version,
            row["post_id"],
            row["reason"],
            row["attempts"],
            row["status"],
            row["last_error"],
            row["next_attempt_at"] == row["created_at"] == row["updated_at"],
        )

    assert [shape(r) for r in outbox_rows(db_engine, snapshot_py)] == [
        shape(r) for r in outbox_rows(db_engine, snapshot_sql)
    ]


# --- bad arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "params", "sqlstate", "message"),
    [
        (RECALC, {"p": None, "t": uuid.uuid4(), "r": "Crud"}, "22004", "project_id must not be"),
        (RECALC, {"p": uuid.uuid4(), "t": None, "r": "Crud"}, "22004", "tenant_id must not be"),
        (RECALC, {"p": uuid.uuid4(), "t": uuid.uuid4(), "r": "Because"}, "22023", "reason must"),
        (RECALC, {"p": uuid.uuid4(), "t": uuid.uuid4(), "r": None}, "22023", "reason must"),
        (DETACH, {"s": None, "p": uuid.uuid4(), "r": "PostDeleted"}, "22004", "snapshot_id must"),
        (DETACH, {"s": uuid.uuid4(), "p": None, "r": "PostDeleted"}, "22004", "post_id must not"),
        (DETACH, {"s": uuid.uuid4(), "p": uuid.uuid4(), "r": "Gone"}, "22023", "reason must be"),
    ],
)
def test_bad_arguments_raise_an_error_naming_the_argument(
    raiser: Raiser, statement: str, params: dict[str, Any], sqlstate: str, message: str
) -> None:
    with pytest.raises(DBAPIError) as caught, raiser.engine.begin() as conn:
        conn.execute(text(statement), params)
    assert caught.value.orig.sqlstate == sqlstate
    assert caught.value.orig.diag.message_primary.startswith(message)


def test_sql_reasons_are_the_python_enums(raiser: Raiser) -> None:
    """Every reason Python accepts is accepted by SQL, and the SQL error lists no other."""
    for statement, enum, key in ((RECALC, RecalcTriggerReason, "t"), (DETACH, Reason, "p")):
        for reason in enum:
            with raiser.engine.begin() as conn:
                args = {"p": uuid.uuid4(), "s": uuid.uuid4(), key: uuid.uuid4(), "r": reason.value}
                assert conn.execute(text(statement), args).scalar() is not None
        with pytest.raises(DBAPIError) as caught, raiser.engine.begin() as conn:
            args = {"p": uuid.uuid4(), "s": uuid.uuid4(), "t": uuid.uuid4(), "r": "x"}
            conn.execute(text(statement), args)
        listed = caught.value.orig.diag.message_primary.split(" one of ")[1].split(" (got")[0]
        assert listed.split(", ") == [r.value for r in enum]


# --- the detach enqueue under a concurrent Done ----------------------------------------------


class Background:
    """Runs `work` on its own thread (its own connection); keeps its result or error."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self.result = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.error = exc

    def join(self) -> Any:
        self._thread.join(30)
        assert not self._thread.is_alive(), "background work did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def install_pause_after_outbox_insert(engine: Engine) -> None:
    """After every INSERT statement on the outbox (also one that inserted nothing because
    of ON CONFLICT DO NOTHING), wait for the advisory lock PAUSE_KEY."""
    with engine.begin() as conn:
        conn.execute(
            text(f"""
            CREATE FUNCTION public.test_pause_after_insert() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock({PAUSE_KEY}); RETURN NULL; END $$
            """)
        )
        conn.execute(
            text("""
            CREATE TRIGGER pause_after_insert AFTER INSERT ON news.snapshot_detach_outbox
            FOR EACH STATEMENT EXECUTE FUNCTION public.test_pause_after_insert()
            """)
        )


def wait_until_paused(engine: Engine, waiting: int = 1) -> None:
    deadline = time.monotonic() + 20
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            count = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND NOT granted AND objid = :key"
                ),
                {"key": PAUSE_KEY},
            ).scalar_one()
            if count >= waiting:
                return
            conn.rollback()
            time.sleep(0.01)
    raise AssertionError("the enqueue never reached the pause")


def wait_until_blocked_on_a_transaction(engine: Engine) -> None:
    deadline = time.monotonic() + 20
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            count = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted"
                )
            ).scalar_one()
            if count:
                return
            conn.rollback()
            time.sleep(0.01)
    raise AssertionError("the second enqueue never waited for the first")


def _enqueue_as(caller: str, raiser: Raiser, db_engine: Engine) -> Callable[..., uuid.UUID]:
    def by_python(snapshot: uuid.UUID, post: uuid.UUID) -> uuid.UUID:
        with db_engine.begin() as conn:
            return enqueue_snapshot_detach(conn, snapshot, post, Reason.POST_DELETED)

    def by_raiser(snapshot: uuid.UUID, post: uuid.UUID) -> uuid.UUID:
        with raiser.engine.begin() as conn:
            own_row(conn)
            params = {"s": snapshot, "p": post, "r": "PostDeleted"}
            return conn.execute(text(DETACH), params).scalar_one()

    return by_python if caller == "python" else by_raiser


@pytest.mark.parametrize("caller", ["python", "raiser"])
def test_enqueue_survives_the_active_row_turning_done_midway(
    caller: str, raiser: Raiser, db_engine: Engine
) -> None:
    """The insert meets the snapshot's active row; the worker marks that row Done and
    commits before the enqueue looks the row up. The enqueue must still give the caller an
    active row (a new one), not an error in the caller's transaction."""
    snapshot, post = uuid.uuid4(), uuid.uuid4()
    enqueue = _enqueue_as(caller, raiser, db_engine)
    active = enqueue(snapshot, post)
    install_pause_after_outbox_insert(db_engine)
    with db_engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PAUSE_KEY})
        holder.commit()
        racing = Background(lambda: enqueue(snapshot, post))
        wait_until_paused(db_engine)
        with db_engine.begin() as worker:
            worker.execute(
                text("UPDATE news.snapshot_detach_outbox SET status = 'Done' WHERE id = :id"),
                {"id": active},
            )
        holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PAUSE_KEY})
        holder.commit()
        fresh = racing.join()
    rows = outbox_rows(db_engine, snapshot)
    assert fresh != active
    assert [(r["id"], r["status"]) for r in rows] == [(active, "Done"), (fresh, "Pending")]


@pytest.mark.parametrize("caller", ["python", "raiser"])
def test_concurrent_enqueues_of_one_snapshot_share_one_row(
    caller: str, raiser: Raiser, db_engine: Engine
) -> None:
    """Two transactions enqueue the same snapshot at once: the second waits for the first's
    uncommitted row and, once it commits, returns that row's id."""
    snapshot, post = uuid.uuid4(), uuid.uuid4()
    enqueue = _enqueue_as(caller, raiser, db_engine)
    install_pause_after_outbox_insert(db_engine)
    with db_engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PAUSE_KEY})
        holder.commit()
        first = Background(lambda: enqueue(snapshot, post))
        wait_until_paused(db_engine)  # first inserted, not committed
        second = Background(lambda: enqueue(snapshot, post))
        wait_until_blocked_on_a_transaction(db_engine)
        holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PAUSE_KEY})
        holder.commit()
        ids = {first.join(), second.join()}
    assert len(ids) == 1
    assert [r["id"] for r in outbox_rows(db_engine, snapshot)] == list(ids)


# --- pin db grant-raiser ---------------------------------------------------------------------


def test_grant_raiser_refuses_a_missing_role(db_engine: Engine) -> None:
    with pytest.raises(RaiserRoleError, match="does not exist: create it first"):
        grant_raiser(db_engine, f"nobody_{uuid.uuid4().hex[:8]}")


def test_pin_db_grant_raiser_lets_a_role_raise(
    db_url: str, db_engine: Engine, admin_engine: Engine
) -> None:
    role = f"svc_{uuid.uuid4().hex[:10]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
    as_role = create_engine(make_url(db_url).set(username=role, password=None))
    try:
        project = uuid.uuid4()
        with pytest.raises(DBAPIError) as before, as_role.begin() as conn:
            conn.execute(text(RECALC), {"p": project, "t": project, "r": "Crud"})
        assert before.value.orig.sqlstate == "42501"

        granted = pin("db", "grant-raiser", role, url=db_url)
        assert granted.returncode == 0, granted.stderr
        assert f"TO {role}" in granted.stdout

        with as_role.begin() as conn:
            conn.execute(text(RECALC), {"p": project, "t": project, "r": "Crud"})
        assert queue_row(db_engine, project) is not None

        missing = pin("db", "grant-raiser", "nobody_here", url=db_url)
        assert missing.returncode != 0
        assert "role 'nobody_here' does not exist: create it first" in missing.stderr
    finally:
        as_role.dispose()
        with db_engine.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
        db_engine.dispose()
        with admin_engine.connect() as conn:
            conn.execute(text(f"DROP ROLE {role}"))


def test_pin_uuid7_is_a_time_ordered_uuid_v7(db_engine: Engine) -> None:
    with db_engine.connect() as conn:
        now_ms = conn.execute(text("SELECT extract(epoch FROM clock_timestamp()) * 1000")).scalar()
        ids = [conn.execute(text("SELECT pin.uuid7()")).scalar_one() for _ in range(3)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(abs((i.int >> 80) - float(now_ms)) < 5_000 for i in ids)
    assert [i.int >> 80 for i in ids] == sorted(i.int >> 80 for i in ids)
    assert len(set(ids)) == 3


def test_migration_0005_downgrades_and_upgrades_again(empty_db_url: str) -> None:
    from alembic import command

    from pin_orchestration.migrations import alembic_config, upgrade_database

    functions = text(
        "SELECT count(*) FROM pg_proc WHERE proname IN "
        "('request_project_recalc', 'request_project_recalc_at', 'enqueue_snapshot_detach', "
        "'uuid7')"
    )
    upgrade_database(empty_db_url)
    engine = create_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(functions).scalar_one() == 4
        command.downgrade(alembic_config(empty_db_url), "0003")
        with engine.connect() as conn:
            assert conn.execute(functions).scalar_one() == 0
        upgrade_database(empty_db_url)
        with engine.connect() as conn:
            assert conn.execute(functions).scalar_one() == 4
    finally:
        engine.dispose()
