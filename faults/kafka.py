"""A Kafka-protocol broker on loopback for the fault suite, behind a FaultProxy.

librdkafka's mock cluster runs in this process (no JVM, no container). A client learns the
broker's address from the metadata it fetches and reconnects there, so a proxy in front of
the bootstrap address alone would stop cutting Kafka once a producer had connected. The
mock cluster is therefore made through librdkafka's C API (ctypes, the very library
confluent_kafka loaded) so that it can advertise the proxy's port as the broker's: every
connection, bootstrap or not, goes through the proxy, and `proxy.set_mode("down")` cuts
Kafka for clients already connected too.

Reading a topic back is the suite's independent record of what was delivered.
"""

from __future__ import annotations

import ctypes
import glob
import os
import time
from dataclasses import dataclass

import confluent_kafka
from confluent_kafka import Consumer, TopicPartition

from faults.proxy import FaultProxy

_RD_KAFKA_PRODUCER = 0
_BROKER_ID = 1  # the mock cluster numbers its brokers from 1


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka that confluent_kafka's wheel bundles (already loaded: same handle)."""
    package = os.path.dirname(confluent_kafka.__file__)
    found = glob.glob(os.path.join(package, os.pardir, "confluent_kafka.libs", "librdkafka*"))
    lib = ctypes.CDLL(found[0] if found else "librdkafka.so.1")
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    signatures: dict[str, tuple[list[type], type | None]] = {
        "rd_kafka_conf_new": ([], vp),
        "rd_kafka_conf_set": ([vp, cp, cp, cp, ctypes.c_size_t], ctypes.c_int),
        "rd_kafka_new": ([ctypes.c_int, vp, cp, ctypes.c_size_t], vp),
        "rd_kafka_destroy": ([vp], None),
        "rd_kafka_mock_cluster_new": ([vp, ctypes.c_int], vp),
        "rd_kafka_mock_cluster_bootstraps": ([vp], cp),
        "rd_kafka_mock_cluster_destroy": ([vp], None),
        "rd_kafka_mock_broker_set_host_port": ([vp, ctypes.c_int32, cp, ctypes.c_int], None),
    }
    for name, (args, result) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


@dataclass(frozen=True)
class TopicMessage:
    topic: str
    partition: int
    offset: int
    key: str
    headers: dict[str, str]


class MockKafka:
    """One mock broker, reachable only through `proxy` (its address is `bootstrap`); use it
    with contextlib.closing."""

    def __init__(self) -> None:
        self._lib = _librdkafka()
        errstr = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        # The handle only hosts the cluster: no bootstrap of its own, so no warning about it.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
        self._handle = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self._handle:
            raise RuntimeError(f"librdkafka: {errstr.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._handle, 1)
        if not self._cluster:
            self._lib.rd_kafka_destroy(self._handle)
            raise RuntimeError("librdkafka: the mock cluster did not start")
        broker = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()
        host, port = broker.split(",")[0].rsplit(":", 1)
        self.proxy = FaultProxy(host, int(port))
        self._lib.rd_kafka_mock_broker_set_host_port(
            self._cluster, _BROKER_ID, b"127.0.0.1", self.proxy.port
        )
        self.bootstrap = self.proxy.address

    def read_topics(self, topics: list[str], *, timeout: float = 30) -> list[TopicMessage]:
        """Every message on `topics`, from the first offset to the high watermark, in
        partition order (the order a consumer of one partition sees them)."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"faults-readback-{time.time_ns()}",
                "enable.auto.commit": False,
                "log_level": 3,
            }
        )
        try:
            ends: dict[tuple[str, int], int] = {}
            metadata = consumer.list_topics(timeout=timeout)
            for topic in topics:
                if topic not in metadata.topics:
                    continue  # never produced to
                for partition in metadata.topics[topic].partitions:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=timeout
                    )
                    if high > 0:
                        ends[(topic, partition)] = high
            consumer.assign(
                [TopicPartition(t, p, confluent_kafka.OFFSET_BEGINNING) for t, p in ends]
            )
            messages: list[TopicMessage] = []
            positions = dict.fromkeys(ends, 0)
            deadline = time.monotonic() + timeout
            while any(positions[tp] < ends[tp] for tp in ends):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topics} back: stuck at {positions} of {ends}")
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                tp = (msg.topic(), msg.partition())
                positions[tp] = msg.offset() + 1
                messages.append(
                    TopicMessage(
                        topic=msg.topic(),
                        partition=msg.partition(),
                        offset=msg.offset(),
                        key=(msg.key() or b"").decode(),
                        headers={k: (v or b"").decode() for k, v in msg.headers() or []},
                    )
                )
            return sorted(messages, key=lambda m: (m.topic, m.partition, m.offset))
        finally:
            consumer.close()

    def close(self) -> None:
        self.proxy.close()
        self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
        self._lib.rd_kafka_destroy(self._handle)
