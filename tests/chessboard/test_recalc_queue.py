"""Seed 002's test table (AGG-9), against the real PostgreSQL: the debounce queue, the
per-project recalc and the drain tick."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from pin_orchestration.chessboard.drain import POISON_ALERT, drain_tick
from pin_orchestration.chessboard.queue import (
    RecalcConfigError,
    RecalcPolicy,
    request_project_recalc,
    reset_poison_row,
)
from pin_orchestration.chessboard.recalc import find_divergence
from tests.chessboard.world import (
    T0,
    D,
    add_building,
    add_layout,
    add_layout_group,
    add_object,
    add_project,
    enqueue,
    outbox,
    queue_row,
    row,
)

DUE = T0 + timedelta(seconds=31)


def test_formulas_over_a_full_project(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn, property_objects_total_count=99)
        b1, b2 = add_building(conn, p), add_building(conn, p)
        g1, g2 = add_layout_group(conn, p), add_layout_group(conn, p)
        l1 = add_layout(conn, p, g1, "40.5")
        l2 = add_layout(conn, p, g1, "72.0")
        add_layout(conn, p, g1, "10.0", deleted=True)  # dead layout: not in the group
        l3 = add_layout(conn, p, g2, "55.0")
        add_object(conn, p, status="Free", price="100", building_id=b1, layout_id=l1)
        add_object(conn, p, status="Free", price="300", building_id=b1, layout_id=l2)
        add_object(conn, p, status="Sold", price="50", building_id=b1, layout_id=l1)
        add_object(conn, p, status="Booked", price="10", building_id=b2, layout_id=l2)
        add_object(conn, p, status="Hidden", price="1", building_id=b2, layout_id=l2)
        add_object(conn, p, status="Free", price="5", building_id=b2, layout_id=l3, deleted=True)
        other = add_project(conn)
        add_object(conn, other, status="Free", price="1")  # another project's object
    enqueue(db_engine, p)

    tick = drain_tick(db_engine, now=DUE)

    assert [o.result for o in tick.outcomes] == ["recalculated"]
    with db_engine.connect() as conn:
        project = row(conn, "projects", p)
        assert (project["price_min"], project["price_max"]) == (D("100"), D("300"))
        assert project["property_objects_free_count"] == 2
        assert project["property_objects_total_count"] == 4  # Hidden and deleted excluded
        assert project["version"] == 2
        assert [
            (
                row(conn, "buildings", b)["property_objects_total_count"],
                row(conn, "buildings", b)["property_objects_free_count"],
            )
            for b in (b1, b2)
        ] == [(3, 2), (1, 0)]
        assert [row(conn, "layouts", x)["property_objects_count"] for x in (l1, l2, l3)] == [
            2,
            2,
            0,
        ]
        group1, group2 = row(conn, "layout_groups", g1), row(conn, "layout_groups", g2)
        assert (group1["layouts_count"], group1["area_min"], group1["area_max"]) == (
            2,
            D("40.5"),
            D("72.0"),
        )
        assert (group2["layouts_count"], group2["area_min"], group2["area_max"]) == (
            1,
            D("55.0"),
            D("55.0"),
        )
        assert queue_row(conn, p) is None
        assert find_divergence(conn, p) == []
        events = outbox(conn)
    # project, l1, l2 and both groups changed; l3 stayed 0 → no event for it.
    assert sorted((e["entity"], e["entity_id"]) for e in events) == sorted(
        [("project", p), ("layout", l1), ("layout", l2), ("layout_group", g1), ("layout_group", g2)]
    )
    project_event = next(e for e in events if e["entity"] == "project")
    assert project_event["topic"] == "pin.chessboard.project-upserted.v1"
    assert project_event["version"] == 2
    assert project_event["payload"]["contract_version"] == 1
    assert project_event["payload"]["snapshot"]["property_objects_free_count"] == 2


def test_empty_tick_is_a_noop(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
    enqueue(db_engine, p)  # due at T0+30s, not yet

    assert drain_tick(db_engine, now=T0 + timedelta(seconds=29)).outcomes == []
    with db_engine.connect() as conn:
        assert queue_row(conn, p) is not None
        assert outbox(conn) == []
        assert row(conn, "projects", p)["version"] == 1
    with db_engine.begin() as conn:
        conn.execute(text("DELETE FROM chessboard.project_recalc_requests"))
    assert drain_tick(db_engine, now=DUE).outcomes == []


def test_project_without_free_objects(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn, price_min=D("1"), price_max=D("2"), property_objects_free_count=3)
        add_object(conn, p, status="Sold", price="100")
        add_object(conn, p, status="Booked", price="200")
        add_object(conn, p, status="Hidden", price="300")
    enqueue(db_engine, p)

    drain_tick(db_engine, now=DUE)

    with db_engine.connect() as conn:
        project = row(conn, "projects", p)
        assert (project["price_min"], project["price_max"]) == (None, None)
        assert project["property_objects_free_count"] == 0
        assert project["property_objects_total_count"] == 2
        assert [(e["entity"], e["entity_id"], e["version"]) for e in outbox(conn)] == [
            ("project", p, 2)
        ]


def test_project_without_objects_or_layouts(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(
            conn,
            price_min=D("1"),
            price_max=D("9"),
            property_objects_total_count=4,
            property_objects_free_count=2,
        )
        b = add_building(conn, p)
        g = add_layout_group(conn, p)
        conn.execute(
            text(
                "UPDATE chessboard.buildings SET property_objects_total_count = 7, "
                "property_objects_free_count = 7 WHERE id = :b"
            ),
            {"b": b},
        )
        conn.execute(
            text(
                "UPDATE chessboard.layout_groups SET layouts_count = 3, area_min = 1, "
                "area_max = 2 WHERE id = :g"
            ),
            {"g": g},
        )
    enqueue(db_engine, p)

    drain_tick(db_engine, now=DUE)

    with db_engine.connect() as conn:
        project = row(conn, "projects", p)
        assert (project["price_min"], project["price_max"]) == (None, None)
        assert (
            project["property_objects_total_count"],
            project["property_objects_free_count"],
        ) == (0, 0)
        building = row(conn, "buildings", b)
        assert (
            building["property_objects_total_count"],
            building["property_objects_free_count"],
        ) == (0, 0)
        group = row(conn, "layout_groups", g)
        assert (group["layouts_count"], group["area_min"], group["area_max"]) == (0, None, None)


def test_coalescing_n_events_give_one_row_and_one_run(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
        add_object(conn, p, status="Free", price="10")
    n = 7
    for i in range(n):
        enqueue(db_engine, p, at=T0 + timedelta(seconds=i), reason="PropertyObjectPriceChanged")
    with db_engine.connect() as conn:
        request = queue_row(conn, p)
        count = conn.execute(text("SELECT count(*) FROM chessboard.project_recalc_requests"))
        assert count.scalar() == 1
    assert request["requested_count"] == n
    assert request["first_requested_at"] == T0
    assert request["due_at"] == T0 + timedelta(seconds=n - 1 + 30)  # trailing debounce
    assert request["last_reason"] == "PropertyObjectPriceChanged"

    tick = drain_tick(db_engine, now=T0 + timedelta(seconds=n + 30))

    assert len(tick.outcomes) == 1 and tick.outcomes[0].requested_count == n
    with db_engine.connect() as conn:
        assert [e["entity"] for e in outbox(conn)] == ["project"]
        coalesced = conn.execute(
            text(
                "SELECT value FROM chessboard.recalc_metrics WHERE name = 'coalesced_events_total'"
            )
        ).scalar()
    assert coalesced == n


def test_starvation_cap_forces_a_run_at_the_cap(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
        add_object(conn, p, status="Free", price="10")
    cap = T0 + timedelta(minutes=5)
    at = T0
    # A change every 10 s for longer than the cap: trailing debounce alone would never fire.
    while at < cap:
        due = enqueue(db_engine, p, at=at)
        assert due <= cap
        assert drain_tick(db_engine, now=at).outcomes == []
        at += timedelta(seconds=10)
    assert due == cap

    tick = drain_tick(db_engine, now=cap)

    assert [o.result for o in tick.outcomes] == ["recalculated"]
    assert tick.outcomes[0].requested_count == 30
    with db_engine.connect() as conn:
        assert queue_row(conn, p) is None
    # The next change opens a fresh window with its own cap.
    assert enqueue(db_engine, p, at=cap + timedelta(seconds=1)) == cap + timedelta(seconds=31)


def test_duplicate_run_same_values_and_new_version_only_on_diff(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
        g = add_layout_group(conn, p)
        lay = add_layout(conn, p, g, "30")
        o = add_object(conn, p, status="Free", price="10", layout_id=lay)
    enqueue(db_engine, p)
    drain_tick(db_engine, now=DUE)
    with db_engine.connect() as conn:
        first = (row(conn, "projects", p), row(conn, "layouts", lay), row(conn, "layout_groups", g))
        events_after_first = len(outbox(conn))

    enqueue(db_engine, p, at=DUE)
    drain_tick(db_engine, now=DUE + timedelta(seconds=31))

    with db_engine.connect() as conn:
        second = (
            row(conn, "projects", p),
            row(conn, "layouts", lay),
            row(conn, "layout_groups", g),
        )
        assert second == first  # same values, same versions, same updated_at
        assert len(outbox(conn)) == events_after_first

    with db_engine.begin() as conn:  # a price change touches only the project
        conn.execute(
            text("UPDATE chessboard.property_objects SET price = 12 WHERE id = :o"), {"o": o}
        )
    enqueue(db_engine, p, at=DUE + timedelta(minutes=1))
    drain_tick(db_engine, now=DUE + timedelta(minutes=2))

    with db_engine.connect() as conn:
        assert row(conn, "projects", p)["version"] == first[0]["version"] + 1
        assert row(conn, "layouts", lay)["version"] == first[1]["version"]
        assert row(conn, "layout_groups", g)["version"] == first[2]["version"]
        new = outbox(conn)[events_after_first:]
    assert [(e["entity"], e["version"]) for e in new] == [("project", first[0]["version"] + 1)]


def test_building_counters_update_without_an_event(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        p = add_project(conn)
        b = add_building(conn, p)
        add_object(conn, p, status="Free", price="10", building_id=b)
    enqueue(db_engine, p)
    drain_tick(db_engine, now=DUE)
    with db_engine.begin() as conn:  # Free → Sold: building counts move, project's too
        conn.execute(text("UPDATE chessboard.property_objects SET status = 'Sold'"))
        conn.execute(text("DELETE FROM chessboard.event_outbox"))
    enqueue(db_engine, p, at=DUE)
    drain_tick(db_engine, now=DUE + timedelta(seconds=31))

    with db_engine.connect() as conn:
        building = row(conn, "buildings", b)
        assert (
            building["property_objects_total_count"],
            building["property_objects_free_count"],
        ) == (1, 0)
        assert building["version"] == 1
        assert {e["entity"] for e in outbox(conn)} == {"project"}


def test_partial_failure_rolls_back_only_that_project(
    db_engine: Engine, failing_project, caplog: pytest.LogCaptureFixture
) -> None:
    with db_engine.begin() as conn:
        a = add_project(conn)
        add_object(conn, a, status="Free", price="1")
        bad = failing_project(conn)
        c = add_project(conn)
        add_object(conn, c, status="Free", price="1")
        g = add_layout_group(conn, bad)  # would change, but must roll back with the project
        add_layout(conn, bad, g, "20")
    for p in (a, bad, c):
        enqueue(db_engine, p)

    tick = drain_tick(db_engine, now=DUE)

    assert sorted(o.result for o in tick.outcomes) == ["failed", "recalculated", "recalculated"]
    with db_engine.connect() as conn:
        assert queue_row(conn, a) is None and queue_row(conn, c) is None
        request = queue_row(conn, bad)
        assert request["attempt_count"] == 1
        assert "disk on fire" in request["last_error"]
        assert request["due_at"] == T0 + timedelta(seconds=30)  # due_at not moved…
        assert request["not_before"] == DUE + timedelta(seconds=5)  # …retried a tick later
        assert row(conn, "layout_groups", g)["layouts_count"] == 0  # rolled back
        assert {e["entity_id"] for e in outbox(conn)} == {a, c}
    assert drain_tick(db_engine, now=DUE + timedelta(seconds=4)).outcomes == []

    # Retried on each later tick; the fifth failure raises the poison alert and the row
    # stays for manual handling, no longer claimed.
    with caplog.at_level(logging.ERROR):
        for i in range(4):
            drain_tick(db_engine, now=DUE + timedelta(seconds=5 * (i + 1)))
    assert POISON_ALERT in caplog.text
    with db_engine.connect() as conn:
        assert queue_row(conn, bad)["attempt_count"] == 5
    assert drain_tick(db_engine, now=DUE + timedelta(minutes=1)).outcomes == []

    with db_engine.begin() as conn:  # the runbook: fix the cause, then reset
        conn.execute(text("DROP TRIGGER fail_recalc ON chessboard.projects"))
    assert reset_poison_row(db_engine, bad, now=DUE)
    tick = drain_tick(db_engine, now=DUE + timedelta(minutes=1))
    assert [(o.project_id, o.result) for o in tick.outcomes] == [(bad, "recalculated")]


def test_deleted_or_archived_project_is_dropped_without_events(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        archived = add_project(conn, status="Archived", property_objects_total_count=9)
        deleted = add_project(conn, deleted=True, property_objects_total_count=9)
        add_object(conn, archived, status="Free", price="1")
        add_object(conn, deleted, status="Free", price="1")
        missing = uuid.uuid4()
    for p in (archived, deleted):
        enqueue(db_engine, p)
    with db_engine.begin() as conn:
        request_project_recalc(conn, missing, uuid.uuid4(), "Crud", now=T0)

    tick = drain_tick(db_engine, now=DUE)

    assert [o.result for o in tick.outcomes] == ["skipped"] * 3
    with db_engine.connect() as conn:
        assert all(queue_row(conn, p) is None for p in (archived, deleted, missing))
        assert outbox(conn) == []
        assert row(conn, "projects", archived)["property_objects_total_count"] == 9
        assert row(conn, "projects", deleted)["version"] == 1


def test_cancellation_between_projects(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        projects = [add_project(conn) for _ in range(3)]
        for p in projects:
            add_object(conn, p, status="Free", price="1")
    for i, p in enumerate(projects):
        enqueue(db_engine, p, at=T0 + timedelta(seconds=i))
    stop = threading.Event()

    tick = drain_tick(
        db_engine,
        now=DUE + timedelta(seconds=5),
        on_outcome=lambda _o: stop.set(),
        should_stop=stop.is_set,
    )

    assert tick.stopped and [o.project_id for o in tick.outcomes] == projects[:1]
    with db_engine.connect() as conn:
        assert queue_row(conn, projects[0]) is None
        assert all(queue_row(conn, p) is not None for p in projects[1:])
        assert {e["entity_id"] for e in outbox(conn)} == {projects[0]}


def test_batch_takes_at_most_batch_size_oldest_due_first(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        projects = [add_project(conn) for _ in range(4)]
    for i, p in enumerate(projects):
        enqueue(db_engine, p, at=T0 + timedelta(seconds=10 - i))  # last one due first
    tick = drain_tick(db_engine, now=DUE + timedelta(seconds=10), policy=RecalcPolicy(batch_size=3))
    assert [o.project_id for o in tick.outcomes] == projects[::-1][:3]


def test_bad_reason_and_policy_are_named(db_engine: Engine) -> None:
    with pytest.raises(RecalcConfigError, match="reason must be one of"), db_engine.begin() as c:
        request_project_recalc(c, uuid.uuid4(), uuid.uuid4(), "Because")
    with pytest.raises(RecalcConfigError, match="batch_size must be > 0"):
        RecalcPolicy(batch_size=0).validate()
