"""The outbox publisher end to end against a real Kafka-protocol broker on loopback
(librdkafka's mock cluster), including a broker outage and recovery."""

from __future__ import annotations

import json
import logging
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Consumer, Producer
from sqlalchemy import Engine

from pin_orchestration.chessboard.drain import drain_tick
from pin_orchestration.chessboard.outbox.publisher import (
    JsonlSink,
    KafkaSink,
    kafka_producer_config,
    make_sink,
    publish_pending,
)
from pin_orchestration.chessboard.queue import request_project_recalc
from tests.chessboard.world import add_layout, add_layout_group, add_object, add_project, outbox

T0 = datetime(2030, 1, 1, tzinfo=UTC)
FAST_RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200}


class _BootstrapCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.address: str | None = None
        self.found = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        match = re.search(r"bootstrap\.servers=(\S+)", record.getMessage())
        if match:
            self.address = match.group(1).rstrip(",.")
            self.found.set()


@pytest.fixture
def mock_broker() -> Iterator[str]:
    """A librdkafka mock cluster (one broker); yields its bootstrap address."""
    logger = logging.getLogger(f"kafka-mock-{id(object())}")
    capture = _BootstrapCapture()
    logger.addHandler(capture)
    logger.setLevel(logging.DEBUG)
    owner = Producer({"test.mock.num.brokers": 1, "debug": "mock", "logger": logger})
    owner.poll(0)
    assert capture.found.wait(10), "mock cluster did not report its address"
    yield capture.address
    owner.flush(1)


def consume_all(bootstrap: str, topics: list[str], expected: int) -> list:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics)
    messages = []
    deadline = time.monotonic() + 30
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                messages.append(msg)
        end = time.monotonic() + 1  # and nothing more arrives
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                messages.append(msg)
    finally:
        consumer.close()
    return messages


def recalc_a_project_with_events(engine: Engine) -> list[dict]:
    with engine.begin() as conn:
        p = add_project(conn)
        g = add_layout_group(conn, p)
        lay = add_layout(conn, p, g, "42")
        add_object(conn, p, status="Free", price="10", layout_id=lay)
        request_project_recalc(conn, p, p, "Crud", now=T0)
    drain_tick(engine, now=T0 + timedelta(minutes=1))
    with engine.connect() as conn:
        return outbox(conn)


TOPICS = [
    "pin.chessboard.project-upserted.v1",
    "pin.chessboard.layout-upserted.v1",
    "pin.chessboard.layout-group-upserted.v1",
]


def test_events_reach_kafka_with_topic_key_and_version(db_engine: Engine, mock_broker: str) -> None:
    events = recalc_a_project_with_events(db_engine)
    assert sorted(e["topic"] for e in events) == sorted(TOPICS)
    sink = KafkaSink(mock_broker, message_timeout_ms=10_000)

    result = publish_pending(db_engine, sink)
    sink.close()

    assert (result.read, result.published, result.failed) == (3, 3, 0)
    with db_engine.connect() as conn:
        assert all(e["published_at"] is not None for e in outbox(conn))
    received = consume_all(mock_broker, TOPICS, expected=3)
    got = {(m.topic(), m.key().decode()): json.loads(m.value()) for m in received}
    assert len(received) == 3
    for e in events:
        payload = got[(e["topic"], str(e["entity_id"]))]
        assert payload["version"] == e["version"] == 2
        assert payload["contract_version"] == 1
        assert payload["id"] == str(e["entity_id"])
    headers = dict(received[0].headers())
    assert headers["contract_version"] == b"1"
    assert assert_nothing_more(db_engine, sink_address=mock_broker)


def assert_nothing_more(engine: Engine, sink_address: str) -> bool:
    """A second round finds nothing to send: published rows are not sent again."""
    sink = KafkaSink(sink_address, message_timeout_ms=5_000)
    try:
        return publish_pending(engine, sink).read == 0
    finally:
        sink.close()


class _BootstrapProxy:
    """A TCP forwarder standing for the broker's bootstrap address: down until started.

    The client learns the broker's own address from the metadata it fetches through the
    proxy, so while the proxy is down the broker is unreachable (no metadata), and once
    it is up the same producer recovers.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        with socket.socket() as s:  # a port nothing listens on yet
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._server = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._server.settimeout(0.2)
        self._spawn(self._accept)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(self.target)
            self._spawn(self._pipe, client, upstream)

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        with a, b:
            while not self._stop.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    (b if src is a else a).sendall(data)

    def stop(self) -> None:
        self._stop.set()
        if hasattr(self, "_server"):
            self._server.close()
        for t in self._threads:
            t.join(2)


def test_broker_outage_leaves_rows_unpublished_until_recovery(
    db_engine: Engine, mock_broker: str
) -> None:
    events = recalc_a_project_with_events(db_engine)
    proxy = _BootstrapProxy(mock_broker)
    sink = KafkaSink(proxy.address, message_timeout_ms=1_500, extra_config=FAST_RECONNECT)
    try:
        down = publish_pending(db_engine, sink)  # broker unreachable

        assert (down.published, down.failed) == (0, 3)
        with db_engine.connect() as conn:
            rows = outbox(conn)
        assert all(r["published_at"] is None for r in rows)
        assert all(r["publish_attempts"] == 1 and r["last_error"] for r in rows)

        proxy.start()  # the broker is back; the same publisher carries on
        up = publish_pending(db_engine, sink)
    finally:
        sink.close()
        proxy.stop()

    assert (up.published, up.failed) == (3, 0)
    with db_engine.connect() as conn:
        assert all(r["published_at"] is not None for r in outbox(conn))
    received = consume_all(mock_broker, TOPICS, expected=3)
    assert sorted((m.topic(), m.key().decode()) for m in received) == sorted(
        (e["topic"], str(e["entity_id"])) for e in events
    )


def test_idempotent_producer_settings() -> None:
    config = kafka_producer_config("broker:9092", 30_000)
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"
    assert config["max.in.flight.requests.per.connection"] <= 5


def test_without_kafka_events_go_to_a_local_sink_that_says_so(
    db_engine: Engine, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    events = recalc_a_project_with_events(db_engine)
    with caplog.at_level(logging.INFO):
        sink = make_sink(None, tmp_path)
    assert isinstance(sink, JsonlSink)
    assert "PIN_KAFKA_BOOTSTRAP_SERVERS is not set" in caplog.text
    assert str(tmp_path / "chessboard-events.jsonl") in caplog.text

    assert publish_pending(db_engine, sink).published == 3

    lines = [json.loads(x) for x in sink.path.read_text().splitlines()]
    assert sorted((x["topic"], x["key"], x["version"]) for x in lines) == sorted(
        (e["topic"], str(e["entity_id"]), e["version"]) for e in events
    )
