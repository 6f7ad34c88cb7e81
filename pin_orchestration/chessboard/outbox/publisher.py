"""Delivery of chessboard.event_outbox to Kafka (seed 002, AGG-5), at least once.

The recalc writes snapshot events in the same transaction as the counters they describe;
this publisher reads unpublished rows in id order, produces each to its topic
(`pin.chessboard.<entity>-upserted.v1`, key = entity id, JSON payload with the monotonic
version and contract_version 1) and marks a row published only after the broker has
acknowledged it (delivery report without error). A broker outage leaves rows unpublished
with publish_attempts/last_error; they go out on a later round. Duplicates after a crash
are harmless: consumers upsert by id and ignore versions they have already seen.

One publisher at a time (ordering per key): every publisher (the long-running loop and
the one-shot job / `--once`) holds the distributed lock
`Pin:lock:job:chessboard-outbox-publisher`, renewed in the background while it publishes
(`locks.renewed_lock`); a publisher whose renewal fails starts no further round. The
mark-published is fenced by the lock's token (`locks.take_fence`): a publisher that lost
its lock mid-round (its renewal stuck on a hung database past the TTL) marks nothing once
another publisher took over — those rows go out again, as after a crash — and stops.

Without Kafka configured (no PIN_KAFKA_BOOTSTRAP_SERVERS) the embedded default writes the
same messages to a local JSONL sink under the PIN home, and says so at start.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, Producer
from sqlalchemy import Engine

from pin_orchestration.chessboard.queue import query
from pin_orchestration.coordination.locks import LockLease, LockLost, renewed_lock, take_fence

LOCK_KEY = "Pin:lock:job:chessboard-outbox-publisher"
# Renewed every third of it while a publisher works, so it only bounds how long a crashed
# publisher keeps the others out.
DEFAULT_LOCK_TTL_SECONDS = 60.0
LOCAL_SINK_FILENAME = "chessboard-events.jsonl"
LAST_ERROR_MAX = 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutboxEvent:
    id: int
    topic: str
    entity: str
    entity_id: uuid.UUID
    tenant_id: uuid.UUID | None
    version: int
    payload: dict[str, Any]

    @property
    def key(self) -> bytes:
        return str(self.entity_id).encode()

    @property
    def value(self) -> bytes:
        return json.dumps(self.payload, sort_keys=True, default=str).encode()

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return [
            ("event_type", str(self.payload.get("event_type", "")).encode()),
            ("contract_version", b"1"),
            ("version", str(self.version).encode()),
            ("tenant_id", str(self.tenant_id or "").encode()),
        ]


@dataclass(frozen=True)
class Delivery:
    """Outcome of one round: ids the sink acknowledged, and ids that failed with why."""

    acked: list[int]
    failed: dict[int, str]


class EventSink(Protocol):
    def describe(self) -> str: ...

    def send(self, events: list[OutboxEvent]) -> Delivery: ...

    def close(self) -> None: ...


def kafka_producer_config(bootstrap_servers: str, message_timeout_ms: int) -> dict[str, Any]:
    """Idempotent producer: acks from all in-sync replicas, no duplicates or reordering
    from the producer's own retries."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": "pin-chessboard-outbox-publisher",
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        "retries": 2_147_483_647,
        "message.timeout.ms": message_timeout_ms,
        "linger.ms": 5,
        "compression.type": "lz4",
    }


class KafkaSink:
    def __init__(
        self,
        bootstrap_servers: str,
        *,
        message_timeout_ms: int = 30_000,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._timeout_s = message_timeout_ms / 1000
        config = kafka_producer_config(bootstrap_servers, message_timeout_ms)
        self._producer = Producer({**config, **(extra_config or {})})

    def describe(self) -> str:
        return f"Kafka at {self._bootstrap}"

    def send(self, events: list[OutboxEvent]) -> Delivery:
        acked: list[int] = []
        failed: dict[int, str] = {}

        def report(event_id: int) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                if err is None:
                    acked.append(event_id)
                else:
                    failed[event_id] = str(err)[:LAST_ERROR_MAX]

            return on_delivery

        for event in events:
            while True:
                try:
                    self._producer.produce(
                        event.topic,
                        key=event.key,
                        value=event.value,
                        headers=event.headers,
                        on_delivery=report(event.id),
                    )
                    break
                except BufferError:  # local queue full: serve delivery reports, then retry
                    self._producer.poll(0.1)
        # Every message ends acknowledged or failed within message.timeout.ms.
        self._producer.flush(self._timeout_s + 5)
        return Delivery(acked=acked, failed=failed)

    def close(self) -> None:
        self._producer.flush(self._timeout_s)


class JsonlSink:
    """The embedded default's sink: one JSON object per line, appended and fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"local sink {self.path} (JSONL)"

    def send(self, events: list[OutboxEvent]) -> Delivery:
        with self.path.open("a", encoding="utf-8") as out:
            for e in events:
                line = {
                    "topic": e.topic,
                    "key": str(e.entity_id),
                    "version": e.version,
                    "value": e.payload,
                }
                out.write(json.dumps(line, sort_keys=True, default=str) + "\n")
            out.flush()
            os.fsync(out.fileno())
        return Delivery(acked=[e.id for e in events], failed={})

    def close(self) -> None:
        pass


def make_sink(kafka_bootstrap_servers: str | None, home: Path) -> EventSink:
    """Kafka when configured; otherwise the local JSONL sink — and say which, loudly."""
    if kafka_bootstrap_servers:
        sink: EventSink = KafkaSink(kafka_bootstrap_servers)
    else:
        sink = JsonlSink(home / LOCAL_SINK_FILENAME)
        log.warning(
            "PIN_KAFKA_BOOTSTRAP_SERVERS is not set: chessboard events go to the %s, not to Kafka",
            sink.describe(),
        )
    log.info("chessboard outbox publisher delivering to %s", sink.describe())
    return sink


@dataclass(frozen=True)
class PublishRound:
    read: int
    published: int
    failed: int


def publish_pending(
    engine: Engine, sink: EventSink, *, batch_size: int = 500, lease: LockLease | None = None
) -> PublishRound:
    """One round: up to `batch_size` unpublished events, oldest first, to the sink; mark the
    acknowledged ones published and count an attempt on the failed ones. With the
    publisher's `lease`, the marks are fenced by its token: LockLost when it was lost."""
    with engine.connect() as conn:
        rows = conn.execute(query("unpublished_events"), {"limit": batch_size}).all()
    if not rows:
        return PublishRound(0, 0, 0)
    events = [OutboxEvent(**row._mapping) for row in rows]
    delivery = sink.send(events)
    with engine.begin() as conn:
        if lease is not None:
            take_fence(conn, lease)
        if delivery.acked:
            conn.execute(query("mark_published"), {"ids": delivery.acked})
        if delivery.failed:
            ids = list(delivery.failed)
            conn.execute(
                query("mark_failed"), {"ids": ids, "errors": [delivery.failed[i] for i in ids]}
            )
    if delivery.failed:
        log.warning(
            "chessboard outbox: %d of %d events not acknowledged (%s); they stay unpublished",
            len(delivery.failed),
            len(events),
            next(iter(delivery.failed.values())),
        )
    return PublishRound(len(events), len(delivery.acked), len(delivery.failed))


def drain_outbox(
    engine: Engine,
    sink: EventSink,
    *,
    batch_size: int = 500,
    max_rounds: int = 1_000,
    should_stop: Callable[[], bool] = lambda: False,
    lease: LockLease | None = None,
) -> PublishRound:
    """Publish until the outbox is empty, a round fails, `max_rounds`, or `should_stop()`
    (checked before each round; one-shot use). `lease` fences each round's marks."""
    read = published = failed = 0
    for _ in range(max_rounds):
        if should_stop():
            break
        r = publish_pending(engine, sink, batch_size=batch_size, lease=lease)
        read, published, failed = read + r.read, published + r.published, failed + r.failed
        if r.read < batch_size or r.failed:
            break
    return PublishRound(read, published, failed)


def publish_once(
    engine: Engine,
    sink: EventSink,
    holder: str,
    *,
    lock_ttl_seconds: float = DEFAULT_LOCK_TTL_SECONDS,
    batch_size: int = 500,
) -> PublishRound | None:
    """Drain the outbox once under the publisher's lock (`pin chessboard publish --once`,
    job chessboard_publish_outbox); None when another publisher holds the lock.

    Raises LockLost when the lock was lost midway: the rounds already acknowledged stay
    marked, nothing more is sent.
    """
    with renewed_lock(engine, LOCK_KEY, lock_ttl_seconds, holder) as lease:
        if not lease.acquired:
            return None
        result = drain_outbox(
            engine, sink, batch_size=batch_size, should_stop=lease.lost.is_set, lease=lease
        )
        lease.check()
    return result


def run_publisher(
    engine: Engine,
    sink: EventSink,
    *,
    stop: threading.Event,
    holder: str,
    poll_interval_seconds: float = 1.0,
    lock_ttl_seconds: float = DEFAULT_LOCK_TTL_SECONDS,
    batch_size: int = 500,
) -> None:
    """The long-running publisher: standby until it holds the lock, then publish rounds
    until `stop` is set. Rounds that find nothing sleep `poll_interval_seconds`. The lock
    is renewed while a round runs, however long; if a renewal fails no further round
    starts and the publisher goes back to standby."""
    try:
        while not stop.is_set():
            with renewed_lock(engine, LOCK_KEY, lock_ttl_seconds, holder) as lease:
                if lease.acquired:
                    log.info("chessboard outbox publisher %s took the lock", holder)
                    _publish_while_held(
                        engine, sink, lease, stop, poll_interval_seconds, batch_size
                    )
            stop.wait(poll_interval_seconds)
    finally:
        sink.close()


def _publish_while_held(
    engine: Engine,
    sink: EventSink,
    lease: LockLease,
    stop: threading.Event,
    poll_interval_seconds: float,
    batch_size: int,
) -> None:
    while not stop.is_set() and not lease.lost.is_set():
        started = time.monotonic()
        try:
            r = publish_pending(engine, sink, batch_size=batch_size, lease=lease)
        except LockLost:
            break  # the fence marked the lease lost: nothing of this round was marked
        if r.published:
            log.info(
                "chessboard outbox: published %d events in %.0f ms",
                r.published,
                (time.monotonic() - started) * 1000,
            )
        if r.read < batch_size or r.failed:
            stop.wait(poll_interval_seconds)
    if lease.lost.is_set():
        log.warning("chessboard outbox publisher %s lost the lock: back to standby", lease.holder)
