"""A raiser's transaction against a running recalc, whatever rows it locks and in which
order (issue 20, item 1): on separate connections of the real PostgreSQL, the raiser never
waits and never fails, and the drain neither deadlocks with it nor counts the conflict as
a failed attempt — it leaves the project for a later pass."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import Connection, Engine, text

from pin_orchestration.chessboard.drain import process_next_due
from pin_orchestration.chessboard.queue import query
from pin_orchestration.chessboard.recalc import find_divergence
from tests.chessboard.test_concurrency import Worker, db_now
from tests.chessboard.world import (
    add_layout,
    add_layout_group,
    add_object,
    add_project,
    enqueue,
    queue_row,
)


@dataclass(frozen=True)
class StaleProject:
    """A project whose recalc changes the project row, both layouts and the group (every
    stored counter is stale), so the old drain locked each of them."""

    project: uuid.UUID
    group: uuid.UUID
    first_layout: uuid.UUID
    second_layout: uuid.UUID


def stale_project(engine: Engine) -> StaleProject:
    with engine.begin() as conn:
        p = add_project(conn, property_objects_total_count=9)
        g = add_layout_group(conn, p)
        first = add_layout(conn, p, g, "40")
        second = add_layout(conn, p, g, "60")
        add_object(conn, p, status="Free", price="10", layout_id=first)
        add_object(conn, p, status="Free", price="20", layout_id=second)
    return StaleProject(p, g, first, second)


def touch(table: str) -> str:
    # A raiser's edit of a row: total_area feeds the group's aggregates, the rest is CRUD.
    column = "total_area = total_area + 1" if table == "layouts" else "updated_at = now()"
    return f"UPDATE chessboard.{table} SET {column} WHERE id = :id"


# (first row the raiser locks, then the second): each is a deadlock with a recalc that
# locks project → buildings → layouts → layout groups and waits for the first.
ORDERS = {
    "layout group, then a layout": (("layout_groups", "group"), ("layouts", "first_layout")),
    "a layout, then the project row": (("layouts", "first_layout"), ("projects", "project")),
    "two layouts in opposite order": (
        ("layouts", "second_layout"),
        ("layouts", "first_layout"),
    ),
    "a layout, then only the raise": (("layouts", "first_layout"), None),
}


def wait_until_done_or_blocked(engine: Engine, drain: Worker) -> None:
    """Until the drain has returned or waits on a row lock (what the old drain did): the
    point at which the raiser goes on, not a delay."""
    deadline = time.monotonic() + 15
    with engine.connect() as conn:
        while drain.is_alive():
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
            conn.rollback()
            if waiting:
                return
            assert time.monotonic() < deadline, "the drain neither returned nor waits"
            time.sleep(0.01)


def no_wait(raiser: Connection) -> None:
    """From here on any lock wait fails the raiser's statement at once: "never waits" is
    then an error, not a duration."""
    raiser.execute(text("SET LOCAL lock_timeout = '1ms'"))


@pytest.mark.parametrize("order", list(ORDERS))
def test_raiser_never_waits_nor_fails_and_the_conflict_costs_no_attempt(
    db_engine: Engine, order: str
) -> None:
    world = stale_project(db_engine)
    enqueue(db_engine, world.project, at=db_now(db_engine) - timedelta(minutes=1))
    first, second = ORDERS[order]

    with db_engine.connect() as raiser:
        raiser.execute(text(touch(first[0])), {"id": getattr(world, first[1])})
        drain = Worker(lambda: process_next_due(db_engine))
        drain.start()
        wait_until_done_or_blocked(db_engine, drain)
        no_wait(raiser)
        if second is not None:
            raiser.execute(text(touch(second[0])), {"id": getattr(world, second[1])})
        # The SQL function other services raise with, in the same transaction.
        raiser.execute(
            text(
                "SELECT chessboard.request_project_recalc(id, tenant_id, 'LayoutChanged') "
                "FROM chessboard.projects WHERE id = :p"
            ),
            {"p": world.project},
        )
        raiser.commit()
    # The only claimable row was held: nothing recalculated, no failure recorded.
    assert drain.outcome() is None

    with db_engine.connect() as conn:
        request = queue_row(conn, world.project)
        assert request is not None
        assert request["attempt_count"] == 0 and request["last_error"] is None
        assert request["claim_token"] is None and request["requested_count"] == 2
        conflicts = conn.execute(query("read_metrics")).all()
        assert ("lock_conflicts_total", "", 1.0) in [(r.name, r.label, r.value) for r in conflicts]
    again = process_next_due(db_engine, now=request["due_at"])
    assert again is not None and again.result == "recalculated"
    with db_engine.connect() as conn:
        assert queue_row(conn, world.project) is None
        assert find_divergence(conn, world.project) == []


def test_a_project_left_for_a_held_row_is_retried_after_the_conflict_delay(
    db_engine: Engine,
) -> None:
    world = stale_project(db_engine)
    now = db_now(db_engine)
    enqueue(db_engine, world.project, at=now - timedelta(minutes=1))
    with db_engine.connect() as raiser:
        raiser.execute(text(touch("layouts")), {"id": world.first_layout})
        assert process_next_due(db_engine, now=now) is None
        raiser.rollback()  # the edit is abandoned: no raise will come

    with db_engine.connect() as conn:
        request = queue_row(conn, world.project)
    retry_at = now + timedelta(seconds=1)
    assert request["not_before"] == retry_at and request["attempt_count"] == 0
    assert process_next_due(db_engine, now=retry_at - timedelta(milliseconds=1)) is None
    retried = process_next_due(db_engine, now=retry_at)
    assert retried is not None and retried.result == "recalculated"
