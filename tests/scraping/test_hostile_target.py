"""A target that answers with headers built to break the worker, and a results store that
always fails: every such attempt goes through the retry planner (its attempt budget and
backoff), never an instant requeue that retries for ever. Targets are raw socket servers on
loopback, so the headers reach the fetcher exactly as written."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

import pytest
from sqlalchemy import Engine

from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.results import StoredObject
from tests.scraping.conftest import TEST_SETTINGS, Worker
from tests.scraping.test_worker import attempts, enqueue, job_row

NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class RawTarget:
    """Answers every request on its connection with `answer`'s bytes, as they are, then
    closes the connection; counts the requests (/robots.txt: 404, not counted)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                received = b""
                try:
                    while b"\r\n\r\n" not in received:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        received += chunk
                    if b"\r\n\r\n" not in received:
                        continue
                    if received.startswith(b"GET /robots.txt "):
                        # no robots.txt: everything allowed; not one of the counted answers
                        conn.sendall(NOT_FOUND)
                        continue
                    with self._lock:
                        self.requests += 1
                    conn.sendall(self.answer)
                except OSError:
                    continue

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._listener.close()


@pytest.fixture
def raw_target() -> Iterator[Any]:
    started: list[RawTarget] = []

    def start(answer: bytes) -> RawTarget:
        target = RawTarget(answer)
        started.append(target)
        return target

    yield start
    for target in started:
        target.stop()


@pytest.fixture
def tenant_id(make_tenant) -> uuid.UUID:
    return make_tenant("shop")[0].id


THREE_ATTEMPTS = dataclasses.replace(TEST_SETTINGS, max_attempts=3)


@pytest.fixture
def work_bounded(work: Worker) -> Iterator[Worker]:
    """`work`, stopped after 20 s at the latest: a job that retries for ever keeps a run
    from ever idling, and the test should fail on its figures, not hang."""
    timers: list[threading.Timer] = []

    def run(**kwargs: Any) -> Any:
        stop = threading.Event()
        timer = threading.Timer(20, stop.set)
        timers.append(timer)
        timer.start()
        return work(stop=stop, **kwargs)

    yield run
    for timer in timers:
        timer.cancel()


def test_a_content_length_of_non_ascii_digits_fails_the_job_as_an_invalid_response(
    db_engine: Engine, tenant_id: uuid.UUID, raw_target: Any, work_bounded: Worker
) -> None:
    # "²" (latin-1 0xB2, as http.client decodes header bytes): isdigit() is true, int()
    # raises. The length is no length: an answer without framing, which RFC 9112 §6.3
    # makes an unrecoverable error (read to the close, it passed for a good body). Once,
    # not a crash retried for ever.
    target = raw_target(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: \xb2\r\n"
        b"Connection: close\r\n\r\nhello"
    )
    job_id = enqueue(db_engine, tenant_id, f"{target.url}/x")
    work_bounded(settings=THREE_ATTEMPTS, idle_exit_seconds=1.0)
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("failed", 1, "invalid_response")
    assert target.requests == 1


def test_a_retry_after_beyond_the_calendar_is_ignored_not_a_crash(
    db_engine: Engine, tenant_id: uuid.UUID, raw_target: Any, work_bounded: Worker
) -> None:
    # A valid HTTP-date whose move to UTC leaves datetime's range (OverflowError).
    target = raw_target(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: Fri, 31 Dec 9999 23:59:59 -0100\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    job_id = enqueue(db_engine, tenant_id, f"{target.url}/x")
    work_bounded(settings=THREE_ATTEMPTS, idle_exit_seconds=1.0)
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("failed", 3, "http_503")
    assert target.requests == 3
    assert [a.outcome for a in attempts(db_engine, job_id)] == ["retry", "retry", "failed"]


def test_a_far_future_retry_after_holds_the_job_no_longer_than_a_domain_pause(
    db_engine: Engine, tenant_id: uuid.UUID, raw_target: Any, work_bounded: Worker
) -> None:
    # Year 9999 in GMT parses; the job's retry is capped as the domain's pause is.
    target = raw_target(
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: Fri, 31 Dec 9999 23:59:59 GMT\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    settings = dataclasses.replace(THREE_ATTEMPTS, max_pause_seconds=300)
    job_id = enqueue(db_engine, tenant_id, f"{target.url}/x")
    before = datetime.now(UTC)
    work_bounded(settings=settings)
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("queued", 1, "http_503")
    assert row.next_attempt_at <= datetime.now(UTC) + timedelta(seconds=300)
    assert row.next_attempt_at >= before + timedelta(seconds=299)
    assert target.requests == 1


HOSTILE_ANSWERS = {
    "location_unparsable": b"HTTP/1.1 302 Found\r\nLocation: http://[::1\r\n"
    b"Content-Length: 0\r\n\r\n",
    "location_bad_port": b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:99999999/\r\n"
    b"Content-Length: 0\r\n\r\n",
    "location_latin1": b"HTTP/1.1 301 Moved\r\nLocation: /\xff\xfe\x00x\r\n"
    b"Content-Length: 0\r\n\r\n",
    "location_no_scheme_host": b"HTTP/1.1 307 Temp\r\nLocation: //\r\nContent-Length: 0\r\n\r\n",
    "gzip_garbage": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello",
    "encoding_stack": b"HTTP/1.1 200 OK\r\nContent-Encoding: "
    + b", ".join([b"gzip"] * 50)
    + b"\r\nContent-Length: 5\r\n\r\nhello",
    "unknown_encoding": b"HTTP/1.1 200 OK\r\nContent-Encoding: \xb2zip\r\n"
    b"Content-Length: 5\r\n\r\nhello",
    "content_length_list": b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello",
    "content_length_negative": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
    "content_type_binary": b"HTTP/1.1 200 OK\r\nContent-Type: \x01\x02\xff\r\n"
    b"Content-Length: 5\r\n\r\nhello",
    "chunked_bad_size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"\xb2\r\nhi\r\n0\r\n\r\n",
    "status_line_garbage": b"HTTP/1.1 2\xb200 OK\r\n\r\n",
    "no_status_line": b"\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_ANSWERS))
def test_a_hostile_answer_is_a_fetch_error_or_an_answer_never_a_crash(
    raw_target: Any, name: str
) -> None:
    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.fetch.errors import FetchError
    from pin_orchestration.scraping.policies import fetch_policy_from
    from tests.scraping.conftest import _with_allowed

    target = raw_target(HOSTILE_ANSWERS[name])
    policy = fetch_policy_from(_with_allowed(TEST_SETTINGS, "127.0.0.1/32"))
    with Fetcher(policy) as fetcher, contextlib.suppress(FetchError):
        fetcher.fetch(f"{target.url}/x").close()


class FailingStore(LocalResultStore):
    """A results store whose every put fails (a full disk, a revoked bucket)."""

    def __init__(self, base: LocalResultStore) -> None:
        self.__dict__.update(base.__dict__)
        self.puts = 0

    def put(self, key: str, body: BinaryIO, **kwargs: Any) -> StoredObject:
        self.puts += 1
        raise OSError(28, "No space left on device")


def test_a_store_failing_every_put_spends_the_attempt_budget_with_backoff(
    db_engine: Engine,
    tenant_id: uuid.UUID,
    raw_target: Any,
    work_bounded: Worker,
    local_store: LocalResultStore,
) -> None:
    target = raw_target(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
        b"Connection: close\r\n\r\nhello"
    )
    store = FailingStore(local_store)
    job_id = enqueue(db_engine, tenant_id, f"{target.url}/x")
    work_bounded(settings=THREE_ATTEMPTS, store=store, idle_exit_seconds=1.0)
    row = job_row(db_engine, job_id)
    assert (row.status, row.attempts, row.last_error_class) == ("failed", 3, "worker_error")
    assert "No space left on device" in row.last_error
    assert "attempts exhausted (3 of 3)" in row.last_error
    assert (target.requests, store.puts) == (3, 3)


@pytest.mark.parametrize(
    "answer",
    [
        # A status line with a NUL: http.client quotes the raw line in its error.
        b"HTTP/1.1 2\x0000 OK\r\nContent-Length: 0\r\n\r\n",
        b"\x00\x01\x02 not http\r\n\r\n",
    ],
)
def test_an_error_quoting_a_nul_from_the_target_is_recorded_with_the_other_outcomes(
    db_engine: Engine,
    tenant_id: uuid.UUID,
    raw_target: Any,
    site: Any,
    work_bounded: Worker,
    answer: bytes,
) -> None:
    """A fetch error quotes what the target sent; a NUL in it made PostgreSQL refuse the
    whole round's transaction (text cannot hold one), so no outcome of that round was ever
    written: every job the run had fetched with it, other tenants' too, was retried until
    its lease ran out and the sweeper requeued it, and the hostile job never ended."""
    target = raw_target(answer)
    bad = enqueue(db_engine, tenant_id, f"{target.url}/x")
    good = enqueue(db_engine, tenant_id, f"{site.url}/page/good")
    work_bounded(settings=THREE_ATTEMPTS, idle_exit_seconds=1.0)
    assert (job_row(db_engine, good).status, job_row(db_engine, good).attempts) == (
        "succeeded",
        1,
    )
    row = job_row(db_engine, bad)
    assert (row.status, row.attempts, row.last_error_class) == ("failed", 1, "invalid_response")
    assert "\x00" not in row.last_error and target.requests == 1
    assert [a.outcome for a in attempts(db_engine, bad)] == ["failed"]
