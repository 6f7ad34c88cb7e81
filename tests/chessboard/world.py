"""Builders of chessboard source-of-truth rows for the tests (plain SQL inserts, as an
upstream writer that knows only the seed's columns would do)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import Connection, Engine, text

from pin_orchestration.chessboard.queue import request_project_recalc

# The tests' clock: requests raised at T0 are due at T0 + 30 s.
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def add_project(
    conn: Connection,
    *,
    status: str = "Published",
    deleted: bool = False,
    tenant_id: uuid.UUID | None = None,
    **stored: object,
) -> uuid.UUID:
    pid = uuid.uuid4()
    columns = {"id": pid, "status": status, "tenant_id": tenant_id or uuid.uuid4(), **stored}
    names = ", ".join(columns)
    values = ", ".join(f":{c}" for c in columns)
    conn.execute(text(f"INSERT INTO chessboard.projects ({names}) VALUES ({values})"), columns)
    if deleted:
        conn.execute(
            text("UPDATE chessboard.projects SET deleted_at = now() WHERE id = :id"), {"id": pid}
        )
    return pid


def _add_child(conn: Connection, table: str, project_id: uuid.UUID) -> uuid.UUID:
    child_id = uuid.uuid4()
    conn.execute(
        text(f"INSERT INTO chessboard.{table} (id, project_id) VALUES (:id, :p)"),
        {"id": child_id, "p": project_id},
    )
    return child_id


def add_building(conn: Connection, project_id: uuid.UUID) -> uuid.UUID:
    return _add_child(conn, "buildings", project_id)


def add_layout_group(conn: Connection, project_id: uuid.UUID) -> uuid.UUID:
    return _add_child(conn, "layout_groups", project_id)


def add_layout(
    conn: Connection,
    project_id: uuid.UUID,
    group_id: uuid.UUID | None,
    area: str | None,
    *,
    deleted: bool = False,
) -> uuid.UUID:
    lid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO chessboard.layouts (id, project_id, layout_group_id, total_area, "
            "deleted_at) VALUES (:id, :p, :g, :a, CASE WHEN :d THEN now() END)"
        ),
        {"id": lid, "p": project_id, "g": group_id, "a": area, "d": deleted},
    )
    return lid


def add_object(
    conn: Connection,
    project_id: uuid.UUID,
    *,
    status: str,
    price: str | None = None,
    building_id: uuid.UUID | None = None,
    layout_id: uuid.UUID | None = None,
    deleted: bool = False,
) -> uuid.UUID:
    oid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO chessboard.property_objects (id, project_id, building_id, layout_id, "
            "status, price, deleted_at) "
            "VALUES (:id, :p, :b, :l, :s, :price, CASE WHEN :d THEN now() END)"
        ),
        {
            "id": oid,
            "p": project_id,
            "b": building_id,
            "l": layout_id,
            "s": status,
            "price": price,
            "d": deleted,
        },
    )
    return oid


def row(conn: Connection, table: str, id_: uuid.UUID) -> dict:
    return dict(
        conn.execute(text(f"SELECT * FROM chessboard.{table} WHERE id = :id"), {"id": id_})
        .one()
        ._mapping
    )


def outbox(conn: Connection) -> list[dict]:
    return [
        dict(r._mapping)
        for r in conn.execute(text("SELECT * FROM chessboard.event_outbox ORDER BY id"))
    ]


def queue_row(conn: Connection, project_id: uuid.UUID) -> dict | None:
    r = conn.execute(
        text("SELECT * FROM chessboard.project_recalc_requests WHERE project_id = :p"),
        {"p": project_id},
    ).first()
    return dict(r._mapping) if r else None


D = Decimal


def enqueue(
    engine: Engine, project_id: uuid.UUID, at: datetime = T0, reason: str = "Crud"
) -> datetime:
    """Raise a recalc request for the project at `at` (its tenant); returns the due time."""
    with engine.begin() as conn:
        tenant = (
            conn.execute(
                text("SELECT tenant_id FROM chessboard.projects WHERE id = :p"), {"p": project_id}
            ).scalar()
            or uuid.uuid4()
        )
        return request_project_recalc(conn, project_id, tenant, reason, now=at)
