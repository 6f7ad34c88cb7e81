"""Test data for the news tables, written with plain SQL like an upstream writer would."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from sqlalchemy import Engine, text

from pin_orchestration.platform.ids import uuid7


def add_post(
    engine: Engine,
    *,
    comments_count: int = 0,
    status: str = "Published",
    post_id: uuid.UUID | None = None,
) -> uuid.UUID:
    post_id = post_id or uuid7()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO news.posts (id, status, comments_count) VALUES (:id, :s, :c)"),
            {"id": post_id, "s": status, "c": comments_count},
        )
    return post_id


def add_comments(
    engine: Engine,
    post_id: uuid.UUID,
    count: int,
    *,
    status: str = "Visible",
    at: datetime | None = None,
) -> None:
    at_sql = "now()" if at is None else ":at"
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO news.comments (id, post_id, status, created_at, updated_at) "
                f"SELECT gen_random_uuid(), :post, :status, {at_sql}, {at_sql} "
                f"FROM generate_series(1, :n)"
            ),
            {"post": post_id, "status": status, "n": count, "at": at},
        )


def comments_count(engine: Engine, post_id: uuid.UUID) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT comments_count FROM news.posts WHERE id = :id"), {"id": post_id}
        ).scalar_one()


def days_ago(days: float) -> datetime:
    from datetime import UTC

    return datetime.now(UTC) - timedelta(days=days)
