"""The recalc scenarios hold, and fail naming `recalc.event_reached_kafka` when the outbox
publisher marks events published before Kafka acknowledged them."""

from __future__ import annotations

from pathlib import Path

from tests.faults.broken_build import broken_copy, run_suite


def test_marking_published_before_the_ack_breaks_event_reached_kafka(tmp_path: Path) -> None:
    # The round marks its events published first, then sends them: an event the broker
    # never acknowledges (Kafka cut, the publisher killed) is never sent again.
    root = broken_copy(
        tmp_path,
        "chessboard/outbox/publisher.py",
        "    delivery = sink.send(events)\n",
        "    with engine.begin() as conn:\n"
        '        conn.execute(query("mark_published"), {"ids": [e.id for e in events]})\n'
        "    delivery = sink.send(events)\n",
    )
    result = run_suite(root, "recalc-kafka-outage")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "recalc.event_reached_kafka" in result.stderr
