"""Every event a real sink (Kafka, the JSONL file) is handed anywhere in the test suite is
checked against its committed contract; a test whose events break one fails.

Registered by tests/conftest.py (`pytest_plugins`). Events published by a `pin`
subprocess are not seen here; tests/contracts/test_event_schemas.py checks those paths'
output directly."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from pin_orchestration.chessboard.outbox.publisher import (
    Delivery,
    JsonlSink,
    KafkaSink,
    OutboxEvent,
)
from tests.contracts.events import event_violations

# Topic → events checked in this session (reported at the end of the run).
CHECKED: Counter[str] = Counter()

Send = Callable[[object, list[OutboxEvent]], Delivery]


def _checking(send: Send, violations: list[str]) -> Send:
    def checked_send(self: object, events: list[OutboxEvent]) -> Delivery:
        for event in events:
            violations.extend(event_violations(event))
            CHECKED[event.topic] += 1
        return send(self, events)

    return checked_send


@pytest.fixture(autouse=True)
def _published_events_follow_their_contracts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    violations: list[str] = []
    for sink in (KafkaSink, JsonlSink):
        monkeypatch.setattr(sink, "send", _checking(sink.send, violations))
    yield
    assert not violations, "published events break their committed contract:\n" + "\n".join(
        violations
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if CHECKED:
        per_topic = ", ".join(f"{topic}: {n}" for topic, n in sorted(CHECKED.items()))
        terminalreporter.write_line(
            f"published chessboard events checked against contracts/events: "
            f"{sum(CHECKED.values())} ({per_topic})"
        )
