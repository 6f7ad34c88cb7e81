"""Recalculation of one project's aggregates (seed 002, AGG-3..AGG-5), inside a transaction
the caller owns.

A missing or archived project is a no-op. Otherwise four set-based statements (project,
buildings, layouts, layout groups — chessboard/queries.sql) each aggregate the project's
slice of the source of truth and update only the rows whose stored values differ (version
+ 1, updated_at = now()); one more writes the snapshot events of the changed project /
layouts / layout groups to chessboard.event_outbox. Buildings get their counters but no
event.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection

from pin_orchestration.chessboard.queue import query

ARCHIVED = "Archived"


@dataclass(frozen=True)
class RecalcResult:
    """What one project's recalc found and changed; `skipped` when the project is missing or
    archived (nothing touched)."""

    project_id: uuid.UUID
    skipped: bool = False
    skip_reason: str | None = None
    price_min: Decimal | None = None
    price_max: Decimal | None = None
    property_objects_total_count: int = 0
    property_objects_free_count: int = 0
    buildings: int = 0
    buildings_changed: int = 0
    layouts: int = 0
    layout_groups: int = 0
    republished: dict[str, int] = field(default_factory=dict)

    def as_metadata(self) -> dict[str, Any]:
        """Plain values for logs and Dagster metadata."""
        return {
            "price_min": None if self.price_min is None else float(self.price_min),
            "price_max": None if self.price_max is None else float(self.price_max),
            "property_objects_total_count": self.property_objects_total_count,
            "property_objects_free_count": self.property_objects_free_count,
            "buildings": self.buildings,
            "buildings_changed": self.buildings_changed,
            "layouts": self.layouts,
            "layout_groups": self.layout_groups,
            **{f"republished_{entity}": n for entity, n in self.republished.items()},
        }


def recalc_project(
    conn: Connection, project_id: uuid.UUID, tenant_id: uuid.UUID | None
) -> RecalcResult:
    """Recalculate one project in the caller's transaction (AGG-3..AGG-5).

    `tenant_id` is the events' tenant (the queue row's, per the seed); None takes the
    project's own.
    """
    project = conn.execute(query("lock_project"), {"project_id": project_id}).first()
    if project is None:
        return RecalcResult(project_id, skipped=True, skip_reason="missing")
    if project.status == ARCHIVED or project.deleted_at is not None:
        return RecalcResult(project_id, skipped=True, skip_reason="archived")

    params = {"project_id": project_id}
    totals = conn.execute(query("recalc_project"), params).one()
    buildings = conn.execute(query("recalc_buildings"), params).one()
    layouts = conn.execute(query("recalc_layouts"), params).one()
    groups = conn.execute(query("recalc_layout_groups"), params).one()
    changed = {
        "project": totals.changed_ids or [],
        "layout": layouts.changed_ids or [],
        "layout_group": groups.changed_ids or [],
    }
    if any(changed.values()):
        conn.execute(
            query("write_snapshot_events"),
            {
                "tenant_id": tenant_id or project.tenant_id,
                "project_ids": changed["project"],
                "layout_ids": changed["layout"],
                "layout_group_ids": changed["layout_group"],
            },
        )
    return RecalcResult(
        project_id,
        price_min=totals.price_min,
        price_max=totals.price_max,
        property_objects_total_count=totals.total_count,
        property_objects_free_count=totals.free_count,
        buildings=buildings.rows,
        buildings_changed=buildings.changed,
        layouts=layouts.rows,
        layout_groups=groups.rows,
        republished={entity: len(ids) for entity, ids in changed.items()},
    )


@dataclass(frozen=True)
class Divergence:
    entity: str
    id: uuid.UUID
    stored: dict[str, Any]
    truth: dict[str, Any]


def missing_projects(conn: Connection, project_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """The ids no chessboard.projects row has, in the order given: a divergence check of
    such an id would compare nothing and pass."""
    found = set(conn.execute(query("existing_projects"), {"project_ids": project_ids}).scalars())
    return [p for p in project_ids if p not in found]


def find_divergence(conn: Connection, project_id: uuid.UUID) -> list[Divergence]:
    """Runbook "divergence check": rows whose stored aggregates differ from the truth."""
    rows = conn.execute(query("divergence"), {"project_id": project_id})
    return [Divergence(r.entity, r.id, r.stored, r.truth) for r in rows]
