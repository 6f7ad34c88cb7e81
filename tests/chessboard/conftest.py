"""Fixtures shared by the chessboard tests."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, text

from tests.chessboard.world import add_object, add_project


@pytest.fixture
def failing_project(db_engine: Engine):
    """A project whose recalc fails inside PostgreSQL (a trigger refusing the update)."""

    def make(conn) -> uuid.UUID:
        p = add_project(conn, property_objects_total_count=5)
        add_object(conn, p, status="Free", price="1")
        conn.execute(
            text("""
            CREATE FUNCTION public.test_fail_recalc() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'disk on fire for %', NEW.id; END $$
        """)
        )
        conn.execute(
            text(f"""
            CREATE TRIGGER fail_recalc BEFORE UPDATE ON chessboard.projects
            FOR EACH ROW WHEN (NEW.id = '{p}') EXECUTE FUNCTION public.test_fail_recalc()
        """)
        )
        return p

    return make
