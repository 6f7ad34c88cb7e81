"""The raising contract for other services: which role may call the SQL functions.

Any service raises in its own transaction with one statement:

    SELECT chessboard.request_project_recalc(project_id, tenant_id, 'Crud');
    SELECT news.enqueue_snapshot_detach(snapshot_id, post_id, 'PostDeleted');
    SELECT scraping.submit_job(tenant_id, 'https://example.com/page');

The functions (migration 0005) are SECURITY DEFINER, so EXECUTE on them is all a raiser
needs; `grant_raiser` gives exactly that (plus USAGE on their schemas to name them).
"""

from __future__ import annotations

from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries

RAISER_FUNCTIONS = (
    "chessboard.request_project_recalc(uuid, uuid, text)",
    "news.enqueue_snapshot_detach(uuid, uuid, text)",
    "scraping.submit_job(uuid, text, jsonb, text, text, text)",
)


class RaiserRoleError(ValueError):
    """The role to grant does not exist."""


_query = NamedQueries("pin_orchestration.coordination", "raisers.sql")


def grant_raiser(engine: Engine, role: str) -> list[str]:
    """Grant `role` USAGE on the schemas and EXECUTE on the raising functions; return the
    statements run. The role must exist (it belongs to the other service's deployment)."""
    with engine.begin() as conn:
        if not conn.execute(_query("role_exists"), {"role": role}).scalar_one():
            raise RaiserRoleError(
                f"role {role!r} does not exist: create it first "
                f"(e.g. CREATE ROLE {role} LOGIN PASSWORD '…'), then grant again"
            )
        statements = list(conn.execute(_query("grant_raiser_statements"), {"role": role}).scalars())
        for statement in statements:
            conn.exec_driver_sql(statement)
    return statements
