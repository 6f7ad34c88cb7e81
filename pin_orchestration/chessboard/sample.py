"""A generated chessboard world: projects with buildings, layout groups, layouts and
property objects, inserted set-based (generate_series) — demo data and the bench's load."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import Engine

from pin_orchestration.chessboard.queue import request_project_recalc
from pin_orchestration.platform.sql import NamedQueries

_query = NamedQueries("pin_orchestration.chessboard", "sample.sql")


@dataclass(frozen=True)
class WorldShape:
    projects: int = 20
    buildings: int = 3
    groups: int = 4
    layouts_per_group: int = 3
    objects: int = 200


def generate_world(
    engine: Engine, shape: WorldShape, *, prefix: str, enqueue_new: bool = True
) -> dict[str, int]:
    """Insert the world (idempotent per prefix). New projects get a recalc request, as
    their upstream writer would raise one, so the drain fills their counters."""
    params = {"prefix": prefix, **asdict(shape)}
    counts: dict[str, int] = {}
    with engine.begin() as conn:
        new_projects = conn.execute(_query("projects"), params).all()
        counts["projects"] = len(new_projects)
        for table in ("buildings", "layout_groups", "layouts", "property_objects"):
            counts[table] = conn.execute(_query(table), params).rowcount
        if enqueue_new:
            for project in new_projects:
                request_project_recalc(conn, project.id, project.tenant_id, "Crud")
    return counts
