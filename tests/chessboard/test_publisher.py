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
    LOCK_KEY,
    JsonlSink,
    KafkaSink,
    drain_outbox,
    kafka_producer_config,
    make_sink,
    publish_once,
    publish_pending,
    run_publisher,
)
from pin_orchestration.chessboard.queue import request_project_recalc
from pin_orchestration.coordination.locks import force_release_lock, list_locks, try_acquire_lock
from tests.chessboard.world import add_layout, add_layout_group, add_object, add_project, outbox
from tests.log_gates import LogSeen, watching_log

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
        for t in self._threads:  # the accept loop wakes every 0.2 s and sees the stop
            t.join(2)
        if hasattr(self, "_server"):
            self._server.close()


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


class RecordingSink:
    """A sink that appends to a JSONL file like the embedded default, remembers when it was
    called, and can be made to take `send_seconds` per round (a slow broker)."""

    def __init__(self, path, send_seconds: float = 0.0) -> None:
        self.inner = JsonlSink(path)
        self.send_seconds = send_seconds
        self.sends: list[tuple[float, float, int]] = []  # (started, finished, events)
        self.sending = threading.Event()
        self.closed = False

    def describe(self) -> str:
        return "recording sink"

    def send(self, events):
        started = time.monotonic()
        self.sending.set()
        # The slow broker itself: the scenario under test, not a wait for another thread.
        threading.Event().wait(self.send_seconds)
        delivery = self.inner.send(events)
        self.sends.append((started, time.monotonic(), len(events)))
        return delivery

    def close(self) -> None:
        self.closed = True


def test_a_publish_longer_than_the_lock_ttl_keeps_a_second_publisher_out(
    db_engine: Engine, tmp_path
) -> None:
    recalc_a_project_with_events(db_engine)
    first = RecordingSink(tmp_path / "first.jsonl", send_seconds=6.0)
    second = RecordingSink(tmp_path / "second.jsonl")
    stop_first, stop_second = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def publisher(sink, stop, holder) -> None:
        try:
            run_publisher(
                db_engine,
                sink,
                stop=stop,
                holder=holder,
                lock_ttl_seconds=2.0,
                poll_interval_seconds=0.1,
            )
        except BaseException as exc:  # reported below, never counted as a pass
            errors.append(exc)

    a = threading.Thread(target=publisher, args=(first, stop_first, "first"))
    a.start()
    assert first.sending.wait(10), "the first publisher never started its round"
    b = threading.Thread(target=publisher, args=(second, stop_second, "second"))
    b.start()
    # Three TTLs of one round: the second publisher polls the lock all along.
    while not first.sends:
        assert a.is_alive()
        assert not second.sending.is_set(), "a second publisher started during the publish"
        assert publish_once(db_engine, second, "third", lock_ttl_seconds=2.0) is None
        time.sleep(0.2)
    stop_first.set()
    a.join(10)
    stop_second.set()
    b.join(10)

    assert errors == []
    (started, finished, count) = first.sends[0]
    assert finished - started >= 6.0 and count == 3
    assert second.sends == []  # nothing left for it: every event went out once
    with db_engine.connect() as conn:
        assert all(e["published_at"] is not None for e in outbox(conn))
    assert first.closed and second.closed


def test_publisher_stops_publishing_once_its_lock_is_lost(db_engine: Engine, tmp_path) -> None:
    sink = RecordingSink(tmp_path / "events.jsonl")
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_publisher(
                db_engine,
                sink,
                stop=stop,
                holder="first",
                lock_ttl_seconds=0.9,
                poll_interval_seconds=0.05,
            )
        except BaseException as exc:
            errors.append(exc)

    lost = LogSeen("lost by first")
    t = threading.Thread(target=run)
    with watching_log("pin_orchestration.coordination.locks", lost):
        t.start()
        try:
            deadline = time.monotonic() + 60
            while not (locks := list_locks(db_engine)):
                assert time.monotonic() < deadline, "the publisher never took its lock"
                time.sleep(0.02)
            assert locks[0].holder == "first"
            # The lock passes to someone else (an operator's release, then another process).
            assert force_release_lock(db_engine, LOCK_KEY)
            assert try_acquire_lock(db_engine, LOCK_KEY, 60, "other")
            assert lost.seen.wait(60), "the failed renewal was not noticed"
            events = recalc_a_project_with_events(db_engine)
            # Ten poll intervals in which a publisher still at work would have sent them.
            threading.Event().wait(0.5)
        finally:
            stop.set()
            t.join(60)
    assert not t.is_alive()
    assert errors == []
    assert events and sink.sends == []
    assert list_locks(db_engine)[0].holder == "other"


def test_drain_outbox_publishes_every_round_until_empty(db_engine: Engine, tmp_path) -> None:
    for _ in range(3):
        recalc_a_project_with_events(db_engine)  # 3 events each
    sink = RecordingSink(tmp_path / "events.jsonl")

    result = drain_outbox(db_engine, sink, batch_size=4)

    assert (result.read, result.published, result.failed) == (9, 9, 0)
    assert [count for _, _, count in sink.sends] == [4, 4, 1]
    lines = [json.loads(x) for x in sink.inner.path.read_text().splitlines()]
    with db_engine.connect() as conn:
        rows = outbox(conn)
    assert [x["key"] for x in lines] == [str(r["entity_id"]) for r in rows]  # id order
    assert all(r["published_at"] is not None for r in rows)


def test_drain_outbox_stops_at_a_failed_round_and_on_request(
    db_engine: Engine, mock_broker: str, tmp_path
) -> None:
    for _ in range(2):
        recalc_a_project_with_events(db_engine)
    proxy = _BootstrapProxy(mock_broker)  # never started: the broker is unreachable
    sink = KafkaSink(proxy.address, message_timeout_ms=1_000, extra_config=FAST_RECONNECT)
    try:
        down = drain_outbox(db_engine, sink, batch_size=2)
    finally:
        sink.close()
        proxy.stop()
    assert (down.read, down.published, down.failed) == (2, 0, 2)  # one round, then stop

    calls = RecordingSink(tmp_path / "events.jsonl")
    rounds = iter([False, True])
    stopped = drain_outbox(db_engine, calls, batch_size=2, should_stop=lambda: next(rounds))
    assert stopped.published == 2 and len(calls.sends) == 1


def test_run_publisher_delivers_to_kafka_and_releases_its_lock(
    db_engine: Engine, mock_broker: str
) -> None:
    events = recalc_a_project_with_events(db_engine)
    sink = KafkaSink(mock_broker, message_timeout_ms=10_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_publisher(db_engine, sink, stop=stop, holder="pub", poll_interval_seconds=0.05)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    received = consume_all(mock_broker, TOPICS, expected=3)
    stop.set()
    t.join(15)

    assert errors == [] and not t.is_alive()
    assert sorted((m.topic(), m.key().decode()) for m in received) == sorted(
        (e["topic"], str(e["entity_id"])) for e in events
    )
    with db_engine.connect() as conn:
        assert all(e["published_at"] is not None for e in outbox(conn))
    assert list_locks(db_engine) == []


def test_publish_once_skips_while_the_publisher_holds_the_lock(db_engine: Engine, tmp_path) -> None:
    recalc_a_project_with_events(db_engine)
    sink = RecordingSink(tmp_path / "events.jsonl")
    assert try_acquire_lock(db_engine, LOCK_KEY, 60, "running-publisher")
    assert publish_once(db_engine, sink, "once") is None
    assert sink.sends == []
    assert force_release_lock(db_engine, LOCK_KEY)

    result = publish_once(db_engine, sink, "once")

    assert result is not None and result.published == 3
    assert list_locks(db_engine) == []
