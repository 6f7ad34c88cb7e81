"""Migration 0046 makes the tenants' start tags and the class start clock numeric on a
database with a history: every tag and clock a running queue has reached is carried
exactly (as the very double it was, so tags that differ only past a double's 15th digit stay
apart and in order), the clock slots each keep their own clocks, down gives back the same
doubles, and up again the same numerics."""

from __future__ import annotations

import math
from decimal import Decimal

from alembic import command
from sqlalchemy import Engine, create_engine, text

from pin_orchestration.migrations import alembic_config

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


def _clocks(engine: Engine) -> tuple[dict[int, list[object]], dict[str, object]]:
    with engine.connect() as conn:
        slots = {
            r.slot: list(r.start_clock)
            for r in conn.execute(text("SELECT slot, start_clock FROM scraping.pick_class_clocks"))
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
