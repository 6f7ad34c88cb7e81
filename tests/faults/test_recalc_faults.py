"""The recalc scenarios hold, and fail naming `recalc.event_reached_kafka` when the outbox
publisher marks events published before Kafka acknowledged them."""

from __future__ import annotations

import re
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
    # The suite keeps a broken scenario's logs for whoever runs it by hand; a test's run
    # leaves nothing behind (they were kept in /tmp after every CI run).
    kept = set(re.findall(r"\(logs: (.+?)\)", result.stdout + result.stderr))
    assert kept, result.stdout + result.stderr
    assert not [path for path in kept if Path(path).exists()]


def test_finishing_a_request_raised_during_the_recalc_breaks_aggregates_match_source(
    tmp_path: Path,
) -> None:
    # The finish no longer tells the request it served from one raised during the recalc:
    # the later raise is deleted with the row, and its change never gets a recalc.
    root = broken_copy(
        tmp_path,
        "chessboard/queries.sql",
        "           (requested_count, updated_at, due_at)\n"
        "               = (:requested_count, CAST(:updated_at AS timestamptz),\n"
        "                  CAST(:due_at AS timestamptz)) AS served\n",
        "           true AS served\n",
    )
    result = run_suite(root, "recalc-drain-sigkill")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "recalc.aggregates_match_source" in result.stderr


def test_a_claim_without_its_lease_breaks_one_drain_per_claim(tmp_path: Path) -> None:
    # The claim takes the row without a lease: it stays claimable while its drain
    # recalculates it, and the other drain claims it too.
    root = broken_copy(
        tmp_path,
        "chessboard/queries.sql",
        "SET claimed_until = clock.now + make_interval(secs => :lease_seconds),\n",
        "SET claimed_until = NULL,\n",
    )
    result = run_suite(root, "recalc-drain-sigkill")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "recalc.one_drain_per_claim" in result.stderr
