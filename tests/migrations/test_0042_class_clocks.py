"""Migration 0042 moves the class clocks into eight slots on a database with a history:
the clocks a running queue has reached are carried into every slot (a clock back at 0
would hand every parked tenant the turns it sat out), carried back by the down migration
as the largest over the slots, and into the slots again on the way up."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine, create_engine, text

from pin_orchestration.migrations import alembic_config

CLOCKS = {"high": (3.0, 2.5), "normal": (41.25, 40.0), "low": (7.5, 6.0)}


def _pick_classes(engine: Engine) -> dict[str, tuple[float, float]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT priority, tenant_clock, start_clock FROM scraping.pick_classes")
        ).all()
    return {r.priority: (r.tenant_clock, r.start_clock) for r in rows}


def _class_clocks(engine: Engine) -> dict[str, tuple[float, float]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT priority, tenant_clock, start_clock FROM scraping.class_clocks")
        ).all()
    return {r.priority: (r.tenant_clock, r.start_clock) for r in rows}


def test_0042_carries_the_class_clocks_into_the_slots_and_back(empty_db_url: str) -> None:
    config = alembic_config(empty_db_url)
    command.upgrade(config, "0041")
    engine = create_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            for priority, (tenant_clock, start_clock) in CLOCKS.items():
                conn.execute(
                    text(
                        "UPDATE scraping.pick_classes SET tenant_clock = :t, start_clock = :s"
                        " WHERE priority = :p"
                    ),
                    {"t": tenant_clock, "s": start_clock, "p": priority},
                )

        command.upgrade(config, "0042")
        assert _class_clocks(engine) == CLOCKS
        with engine.connect() as conn:
            slots = conn.execute(
                text(
                    "SELECT count(*) FROM scraping.pick_class_clocks"
                    " WHERE start_clock = ARRAY[2.5, 40.0, 6.0]::float8[]"
                )
            ).scalar_one()
        assert slots == 8, "every slot starts at the clocks reached"

        # Claims raised the clocks in different slots, each behind in some class.
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE scraping.pick_class_clocks SET tenant_clock = '{3, 50, 7.5}',"
                    " start_clock = '{2.5, 49, 6}' WHERE slot = 2"
                )
            )
            conn.execute(
                text(
                    "UPDATE scraping.pick_class_clocks SET tenant_clock = '{9, 41.25, 7.5}',"
                    " start_clock = '{8, 40, 6}' WHERE slot = 6"
                )
            )
        raised = {"high": (9.0, 8.0), "normal": (50.0, 49.0), "low": (7.5, 6.0)}
        assert _class_clocks(engine) == raised

        command.downgrade(config, "0041")
        assert _pick_classes(engine) == raised, "down keeps the largest over the slots"
        command.upgrade(config, "0042")
        assert _class_clocks(engine) == raised
    finally:
        engine.dispose()
