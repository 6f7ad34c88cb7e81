"""The publisher's mark-published is fenced by its lock's token (issue 20): a publisher
whose lock was taken over while it published (its renewal stuck on a hung database past
the TTL) marks nothing and stops; the new holder sends those events again."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from pin_orchestration.chessboard.outbox.publisher import (
    LOCK_KEY,
    JsonlSink,
    OutboxEvent,
    publish_once,
)
from pin_orchestration.coordination.locks import LockLost, list_locks, try_acquire_lock
from tests.chessboard.test_publisher import recalc_a_project_with_events
from tests.chessboard.world import outbox


class TakenOverWhileSending(JsonlSink):
    """Delivers, and meanwhile the lock expires and another publisher takes it."""

    def __init__(self, path: Path, engine: Engine) -> None:
        super().__init__(path)
        self.engine = engine

    def send(self, events: list[OutboxEvent]):
        delivery = super().send(events)
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE pin.distributed_locks SET expires_at = now()"))
        assert try_acquire_lock(self.engine, LOCK_KEY, 60, "new-publisher")
        return delivery


def test_a_publisher_that_lost_its_lock_marks_nothing_and_stops(
    db_engine: Engine, tmp_path: Path
) -> None:
    events = recalc_a_project_with_events(db_engine)
    sink = TakenOverWhileSending(tmp_path / "events.jsonl", db_engine)
    with pytest.raises(LockLost):
        publish_once(db_engine, sink, "stale-publisher", lock_ttl_seconds=60)
    with db_engine.connect() as conn:
        assert [e["published_at"] for e in outbox(conn)] == [None] * len(events)
    assert [lock.holder for lock in list_locks(db_engine)] == ["new-publisher"]
