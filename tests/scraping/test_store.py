"""The results store against a real S3 endpoint (moto's server) and the local directory
store served by its router on a real uvicorn server, both on loopback."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import uvicorn
from fastapi import FastAPI

from pin_orchestration.scraping.api.store_routes import local_results_router
from pin_orchestration.scraping.store.local import (
    LocalResultStore,
    build_result_store,
    load_or_create_signing_key,
)
from pin_orchestration.scraping.store.results import (
    DEFAULT_CONTENT_TYPE,
    S3ResultStore,
    StoredObject,
    result_key,
)

MIB = 1024 * 1024
# Every byte value, over 5 MiB (the multipart threshold of boto's transfer manager).
BIG_BODY = bytes(range(256)) * (6 * MIB // 256) + bytes(range(7))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put_bytes(store: Any, key: str, data: bytes, content_type: str | None) -> StoredObject:
    return store.put(
        key, io.BytesIO(data), size=len(data), sha256=sha256_hex(data), content_type=content_type
    )


def new_key() -> str:
    return result_key(uuid.uuid4(), uuid.uuid4(), datetime.now(UTC), 1)


# --- keys ----------------------------------------------------------------------------------


def test_result_key_is_dated_by_the_utc_day() -> None:
    tenant, job = uuid.uuid4(), uuid.uuid4()
    # 01:30 in Moscow is still the previous day in UTC.
    stored_at = datetime(2026, 12, 1, 1, 30, tzinfo=timezone(timedelta(hours=3)))
    assert result_key(tenant, job, stored_at, 2) == f"results/{tenant}/2026/11/30/{job}/2"


def test_result_key_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        result_key(uuid.uuid4(), uuid.uuid4(), datetime(2026, 12, 1, 12, 0), 1)


# --- S3 (moto server on loopback) ----------------------------------------------------------


# s3_endpoint and s3_store: tests/scraping/conftest.py


def test_s3_put_head_and_presigned_url_return_the_exact_bytes(
    s3_store: S3ResultStore, tmp_path: Path
) -> None:
    key = new_key()
    # The worker hands over a spooled file, not bytes in memory.
    spooled = tmp_path / "body"
    spooled.write_bytes(BIG_BODY)
    with spooled.open("rb") as body:
        stored = s3_store.put(
            key, body, size=len(BIG_BODY), sha256=sha256_hex(BIG_BODY), content_type="image/png"
        )
    expected = StoredObject(key, len(BIG_BODY), sha256_hex(BIG_BODY), "image/png")
    assert stored == expected
    assert s3_store.head(key) == expected

    before = datetime.now(UTC).replace(microsecond=0)
    url, expires_at = s3_store.signed_url(key, ttl_seconds=900)
    after = datetime.now(UTC)
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Expires"] == ["900"]
    assert before + timedelta(seconds=900) <= expires_at <= after + timedelta(seconds=900)

    response = requests.get(url, timeout=30)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "image/png"
    assert response.content == BIG_BODY
    assert s3_store.read_bytes(key) == BIG_BODY


def test_s3_body_without_content_type_is_stored_as_octet_stream(s3_store: S3ResultStore) -> None:
    key = new_key()
    assert put_bytes(s3_store, key, b"x", None).content_type == DEFAULT_CONTENT_TYPE
    assert s3_store.head(key) == StoredObject(key, 1, sha256_hex(b"x"), DEFAULT_CONTENT_TYPE)
    url, _ = s3_store.signed_url(key, ttl_seconds=60)
    assert requests.get(url, timeout=60).headers["Content-Type"] == DEFAULT_CONTENT_TYPE


def test_s3_head_of_an_absent_key_is_none(s3_store: S3ResultStore) -> None:
    assert s3_store.head(new_key()) is None


def test_s3_delete_many_removes_exactly_the_listed_keys(s3_store: S3ResultStore) -> None:
    keys = [new_key() for _ in range(4)]
    for index, key in enumerate(keys):
        put_bytes(s3_store, key, f"body {index}".encode(), "text/plain")
    missing = new_key()

    assert s3_store.delete_many([keys[0], keys[2], missing, keys[0]]) == 3

    listed = s3_store.client.list_objects_v2(Bucket=s3_store.bucket).get("Contents", [])
    assert sorted(item["Key"] for item in listed) == sorted([keys[1], keys[3]])
    assert s3_store.head(keys[0]) is None
    assert s3_store.read_bytes(keys[1]) == b"body 1"


class CountingClient:
    """The real client, recording the DeleteObjects batches it is asked to send."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.delete_batches: list[int] = []

    def delete_objects(self, **kwargs: Any) -> Any:
        self.delete_batches.append(len(kwargs["Delete"]["Objects"]))
        return self._client.delete_objects(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_s3_delete_many_sends_at_most_1000_keys_per_request(s3_store: S3ResultStore) -> None:
    # S3 refuses a DeleteObjects of more than 1,000 keys; moto does not, so count batches.
    counting = CountingClient(s3_store.client)
    store = S3ResultStore(counting, s3_store.bucket)
    kept, doomed = new_key(), new_key()
    put_bytes(store, kept, b"kept", None)
    put_bytes(store, doomed, b"doomed", None)

    assert store.delete_many([doomed] + [new_key() for _ in range(2000)]) == 2001

    assert counting.delete_batches == [1000, 1000, 1]
    assert store.head(doomed) is None
    assert store.head(kept) is not None


def test_s3_signed_url_refuses_a_ttl_s3_would_refuse_and_a_fake_clock(
    s3_store: S3ResultStore,
) -> None:
    key = new_key()
    with pytest.raises(ValueError, match="ttl_seconds"):
        s3_store.signed_url(key, ttl_seconds=8 * 24 * 3600)
    with pytest.raises(ValueError, match="ttl_seconds"):
        s3_store.signed_url(key, ttl_seconds=0)
    with pytest.raises(ValueError, match="now="):
        s3_store.signed_url(key, ttl_seconds=60, now=datetime.now(UTC))
    # A fractional TTL rounds up rather than making an already-dead link.
    url, _ = s3_store.signed_url(key, ttl_seconds=0.2)
    assert parse_qs(urlsplit(url).query)["X-Amz-Expires"] == ["1"]


def test_build_result_store_with_a_bucket_uses_s3(s3_store: S3ResultStore, tmp_path: Path) -> None:
    store = build_result_store(
        bucket=s3_store.bucket,
        endpoint_url=s3_store.client.meta.endpoint_url,
        region_name="us-east-1",
        home=tmp_path,
        public_base_url="http://127.0.0.1:8000",
    )
    assert isinstance(store, S3ResultStore)
    key = new_key()
    put_bytes(store, key, b"through the factory", "text/plain")
    assert s3_store.read_bytes(key) == b"through the factory"
    assert not (tmp_path / "results").exists()


# --- local directory store, served by its router on a real HTTP server ---------------------


@contextmanager
def serve(app: FastAPI, sock: socket.socket) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # a bound for a broken run only
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@pytest.fixture(scope="module")
def local_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A PIN_HOME whose results an API on loopback serves: (home, the API's base URL)."""
    home = tmp_path_factory.mktemp("pin-home")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    served = build_result_store(
        bucket=None, endpoint_url=None, region_name=None, home=home, public_base_url=base_url
    )
    assert isinstance(served, LocalResultStore)
    app = FastAPI()
    app.include_router(local_results_router(served))
    with serve(app, sock):
        yield home, base_url


@pytest.fixture
def local_store(local_home: tuple[Path, str]) -> LocalResultStore:
    """Another store over the served PIN_HOME, as a worker process would build it."""
    home, base_url = local_home
    store = build_result_store(
        bucket=None, endpoint_url=None, region_name=None, home=home, public_base_url=base_url
    )
    assert isinstance(store, LocalResultStore)
    return store


def test_local_put_head_open_and_signed_url_serve_the_exact_bytes(
    local_store: LocalResultStore, local_home: tuple[Path, str]
) -> None:
    home, base_url = local_home
    key = new_key()
    content_type = "text/html; charset=windows-1251"
    expected = StoredObject(key, len(BIG_BODY), sha256_hex(BIG_BODY), content_type)

    assert put_bytes(local_store, key, BIG_BODY, content_type) == expected
    assert local_store.head(key) == expected
    opened = local_store.open(key)
    assert opened is not None
    path, stored = opened
    assert stored == expected
    assert path == home / "results" / key
    assert path.read_bytes() == BIG_BODY
    assert local_store.read_bytes(key) == BIG_BODY

    before = datetime.now(UTC)
    url, expires_at = local_store.signed_url(key, ttl_seconds=900)
    # The key is the link's path: /results/{tenant}/{yyyy}/{mm}/{dd}/{job}, said once.
    assert key.startswith("results/")
    assert url.startswith(f"{base_url}/{key}?expires=")
    assert before + timedelta(seconds=900) <= expires_at <= before + timedelta(seconds=902)
    assert parse_qs(urlsplit(url).query)["expires"] == [str(int(expires_at.timestamp()))]

    response = requests.get(url, timeout=30)
    assert response.status_code == 200
    assert response.content == BIG_BODY
    assert response.headers["Content-Type"] == content_type
    assert response.headers["Content-Length"] == str(len(BIG_BODY))
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_local_body_without_content_type_is_served_as_octet_stream(
    local_store: LocalResultStore,
) -> None:
    key = new_key()
    assert put_bytes(local_store, key, b"", None) == StoredObject(
        key, 0, sha256_hex(b""), DEFAULT_CONTENT_TYPE
    )
    response = requests.get(local_store.signed_url(key, ttl_seconds=60)[0], timeout=60)
    assert response.status_code == 200
    assert response.content == b""
    assert response.headers["Content-Type"] == DEFAULT_CONTENT_TYPE


def with_query(url: str, **changes: str) -> str:
    base, query = url.split("?", 1)
    params = dict(part.split("=", 1) for part in query.split("&"))
    params.update(changes)
    return base + "?" + "&".join(f"{name}={value}" for name, value in params.items())


def test_local_link_with_a_tampered_signature_or_expiry_is_refused(
    local_store: LocalResultStore,
) -> None:
    key, other = new_key(), new_key()
    put_bytes(local_store, key, b"secret", "text/plain")
    put_bytes(local_store, other, b"other", "text/plain")
    url, _ = local_store.signed_url(key, ttl_seconds=600)
    assert requests.get(url, timeout=60).status_code == 200
    signature = parse_qs(urlsplit(url).query)["signature"][0]
    expires = int(parse_qs(urlsplit(url).query)["expires"][0])

    flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
    tampered = [
        with_query(url, signature=flipped),
        with_query(url, signature=signature.upper()),
        with_query(url, signature=""),
        with_query(url, expires=str(expires + 3600)),
        # The same signature on another key.
        url.replace(key, other),
        url.split("?", 1)[0],
        url.split("&", 1)[0],
        # An unsigned look at a key that does not exist learns nothing (403, not 404).
        with_query(url.replace(key, new_key()), signature=flipped),
    ]
    for bad in tampered:
        response = requests.get(bad, timeout=60)
        assert response.status_code == 403, bad
        assert "expired" in response.json()["detail"]


def test_local_expired_link_is_refused(local_store: LocalResultStore) -> None:
    key = new_key()
    put_bytes(local_store, key, b"stale", "text/plain")
    signed_at = datetime.now(UTC) - timedelta(hours=1)
    url, expires_at = local_store.signed_url(key, ttl_seconds=60, now=signed_at)
    assert expires_at < datetime.now(UTC)

    response = requests.get(url, timeout=60)
    assert response.status_code == 403
    assert response.json() == {
        "detail": "result link is invalid or expired; GET /jobs/{id}/result for a new one"
    }


def test_local_verify_holds_until_the_expiry_instant_and_not_at_it(
    local_store: LocalResultStore,
) -> None:
    key = new_key()
    signed_at = datetime(2026, 11, 30, 12, 0, 0, 250_000, tzinfo=UTC)
    url, expires_at = local_store.signed_url(key, ttl_seconds=10.5, now=signed_at)
    # Rounded up to whole seconds: at least the TTL asked for.
    assert expires_at == datetime(2026, 11, 30, 12, 0, 11, tzinfo=UTC)
    query = parse_qs(urlsplit(url).query)
    expires, signature = int(query["expires"][0]), query["signature"][0]

    just_before = expires_at - timedelta(microseconds=1)
    assert local_store.verify(key, expires, signature, now=just_before)
    assert not local_store.verify(key, expires, signature, now=expires_at)
    assert not local_store.verify(key, expires + 1, signature, now=signed_at)
    assert not local_store.verify(key, expires, "é" + signature[1:], now=signed_at)


def test_local_signed_link_to_an_absent_key_is_404(local_store: LocalResultStore) -> None:
    url, _ = local_store.signed_url(new_key(), ttl_seconds=60)
    response = requests.get(url, timeout=60)
    assert response.status_code == 404
    assert response.json() == {"detail": "no result is stored under this link"}


def test_local_link_survives_a_restart_with_the_same_home(
    local_home: tuple[Path, str], tmp_path: Path
) -> None:
    home, base_url = local_home

    def restarted() -> LocalResultStore:
        store = build_result_store(
            bucket=None, endpoint_url=None, region_name=None, home=home, public_base_url=base_url
        )
        assert isinstance(store, LocalResultStore)
        return store

    first = restarted()
    key = new_key()
    put_bytes(first, key, b"kept across restarts", "text/plain")
    url, _ = first.signed_url(key, ttl_seconds=600)
    query = parse_qs(urlsplit(url).query)

    second = restarted()
    assert second.verify(key, int(query["expires"][0]), query["signature"][0])
    # And the API process (a third instance, started before both) serves it.
    assert requests.get(url, timeout=60).content == b"kept across restarts"

    key_file = home / "results-signing.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(key_file.read_bytes()) == 32
    # A different home means a different key: its links are refused here.
    elsewhere = build_result_store(
        bucket=None, endpoint_url=None, region_name=None, home=tmp_path, public_base_url=base_url
    )
    assert isinstance(elsewhere, LocalResultStore)
    assert not elsewhere.verify(key, int(query["expires"][0]), query["signature"][0])


def test_signing_key_created_by_concurrent_processes_is_one_key(tmp_path: Path) -> None:
    path = tmp_path / "home" / "results-signing.key"
    barrier = threading.Barrier(8)

    def load() -> bytes:
        barrier.wait()
        return load_or_create_signing_key(path)

    with ThreadPoolExecutor(max_workers=8) as pool:
        keys = list(pool.map(lambda _: load(), range(8)))
    assert len(set(keys)) == 1
    assert keys[0] == path.read_bytes()
    # No temporary files left behind by the losers.
    assert sorted(p.name for p in path.parent.iterdir()) == ["results-signing.key"]


def test_signing_key_of_the_wrong_length_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results-signing.key"
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="delete it"):
        load_or_create_signing_key(path)


@pytest.mark.parametrize(
    "key",
    [
        "../outside",
        "results/../../outside",
        "/etc/passwd",
        "results\\..\\outside",
        "results/a\x00b",
        "results//a",
        "results/./a",
        "results/.a",
        "results/a/",
        "",
        "results/a.meta.json",
        "results/\udc80",
    ],
)
def test_local_keys_that_could_leave_the_root_are_refused(
    local_store: LocalResultStore, key: str
) -> None:
    before = sorted(local_store.root.parent.rglob("*"))
    with pytest.raises(ValueError, match="result key"):
        put_bytes(local_store, key, b"x", None)
    with pytest.raises(ValueError, match="result key"):
        local_store.head(key)
    with pytest.raises(ValueError, match="result key"):
        local_store.signed_url(key, ttl_seconds=60)
    with pytest.raises(ValueError, match="result key"):
        local_store.delete_many([key])
    expires = int(time.time()) + 60
    # Even this store's own signature of the key does not open it.
    try:
        signature = local_store._signature(key, expires)
    except UnicodeEncodeError:
        signature = "0" * 64
    assert not local_store.verify(key, expires, signature)
    assert sorted(local_store.root.parent.rglob("*")) == before


def test_local_traversal_over_http_is_refused(
    local_store: LocalResultStore, local_home: tuple[Path, str]
) -> None:
    home, base_url = local_home
    (home / "outside").write_bytes(b"not a result")
    expires = int(time.time()) + 60
    # A signature made with the right key for the traversal path: still no file.
    signature = local_store._signature("results/../../outside", expires)
    for path in ("results/..%2F..%2Foutside", "results/%2E%2E/%2E%2E/outside"):
        response = requests.get(
            f"{base_url}/{path}?expires={expires}&signature={signature}", timeout=10
        )
        assert response.status_code == 403
        assert b"not a result" not in response.content


class ObservingReader(io.BytesIO):
    """A body that, halfway through being read, records what a reader of the store sees."""

    def __init__(self, data: bytes, look: Any) -> None:
        super().__init__(data)
        self._look = look
        self._half = len(data) // 2
        self.seen: list[Any] = []

    def read(self, size: int | None = -1) -> bytes:
        if not self.seen and self.tell() >= self._half:
            self.seen.append(self._look())
        return super().read(size)


def _fsyncs_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Every fsync ended from now on: the path synced and, for a directory, its entries
    before the sync began (those it surely made durable)."""
    seen: list[tuple[str, list[str]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
        real_fsync(fd)
        seen.append((path, entries))

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _synced_with(seen: list[tuple[str, list[str]]], directory: Path) -> bool:
    """Whether `directory`'s entry in its parent was made durable: a fsync of the parent
    that listed it."""
    return any(
        path == str(directory.parent) and directory.name in entries for path, entries in seen
    )


def test_local_put_makes_the_directories_it_creates_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new directory is an entry in its parent's data: until the parent is synced, a
    crash of the machine may lose the directory with the object in it (ext4 without a
    journal puts it in lost+found) while its job already reads succeeded. Each directory a
    put creates, from the store's root down to the job's, is durable when the put returns;
    so is the job's directory made by a later put beside the first."""
    local_store = LocalResultStore(
        tmp_path / "home" / "results", public_base_url="http://testserver", signing_key=b"k" * 32
    )
    seen = _fsyncs_seen(monkeypatch)
    first = new_key()
    put_bytes(local_store, first, b"first", None)
    job_dir = (local_store.root / first).parent
    created = [job_dir, *[d for d in job_dir.parents if local_store.root in (d, *d.parents)]]
    assert local_store.root in created and len(created) == 7
    for directory in created:
        assert _synced_with(seen, directory), directory

    seen.clear()
    second = "/".join([*first.split("/")[:-2], str(uuid.uuid4()), "1"])
    put_bytes(local_store, second, b"second", None)
    assert _synced_with(seen, (local_store.root / second).parent)
    assert not _synced_with(seen, job_dir.parent)  # the day's directory was there already


def test_concurrent_local_puts_share_the_syncs_of_their_day_and_each_returns_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts of one day at once (a worker's slots): a sync of the day's directory begun
    after a put's job directory was made serves that put, whoever ran it; each put returns
    only once one has ended."""
    local_store = LocalResultStore(
        tmp_path / "results", public_base_url="http://testserver", signing_key=b"k" * 32
    )
    tenant, created = uuid.uuid4(), datetime.now(UTC)
    put_bytes(local_store, result_key(tenant, uuid.uuid4(), created, 1), b"first", None)
    seen = _fsyncs_seen(monkeypatch)
    barrier = threading.Barrier(16)
    not_durable: list[str] = []

    def put_some(_: int) -> None:
        barrier.wait()
        for _ in range(10):
            key = result_key(tenant, uuid.uuid4(), created, 1)
            put_bytes(local_store, key, key.encode(), None)
            if not _synced_with(list(seen), (local_store.root / key).parent):
                not_durable.append(key)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put_some, range(16)))
    assert not not_durable
    day = str((local_store.root / result_key(tenant, uuid.uuid4(), created, 1)).parent.parent)
    assert 0 < sum(path == day for path, _ in seen) <= 160


def test_local_put_never_shows_a_partial_file(local_store: LocalResultStore) -> None:
    key = new_key()
    final = local_store.root / key

    def look() -> tuple[bool, list[str], StoredObject | None]:
        siblings = sorted(p.name for p in final.parent.iterdir())
        return final.exists(), siblings, local_store.head(key)

    first = ObservingReader(BIG_BODY, look)
    local_store.put(
        key, first, size=len(BIG_BODY), sha256=sha256_hex(BIG_BODY), content_type="text/plain"
    )
    exists, siblings, head = first.seen[0]
    assert not exists and head is None
    # The bytes so far live in a temporary file in the same directory (so the rename
    # that publishes them is atomic), under a dot-name no key can have.
    assert len(siblings) == 1 and siblings[0].startswith(f".{final.name}.")

    replacement = b"replacement" * 100_000

    def look_again() -> tuple[bytes, StoredObject | None]:
        return final.read_bytes(), local_store.head(key)

    second = ObservingReader(replacement, look_again)
    local_store.put(
        key, second, size=len(replacement), sha256=sha256_hex(replacement), content_type=None
    )
    old_bytes, old_head = second.seen[0]
    assert old_bytes == BIG_BODY
    assert old_head == StoredObject(key, len(BIG_BODY), sha256_hex(BIG_BODY), "text/plain")
    assert local_store.read_bytes(key) == replacement
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name, final.name + ".meta.json"]


def test_local_put_of_a_body_unlike_its_declared_digest_leaves_the_old_object(
    local_store: LocalResultStore,
) -> None:
    key = new_key()
    put_bytes(local_store, key, b"good", "text/plain")
    final = local_store.root / key
    with pytest.raises(ValueError, match="sha256"):
        local_store.put(
            key, io.BytesIO(b"evil"), size=4, sha256=sha256_hex(b"good"), content_type=None
        )
    with pytest.raises(ValueError, match="size"):
        local_store.put(
            key, io.BytesIO(b"longer"), size=4, sha256=sha256_hex(b"longer"), content_type=None
        )
    assert local_store.read_bytes(key) == b"good"
    assert local_store.head(key) == StoredObject(key, 4, sha256_hex(b"good"), "text/plain")
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name, final.name + ".meta.json"]


def test_local_put_refuses_a_content_type_that_cannot_be_a_header(
    local_store: LocalResultStore,
) -> None:
    with pytest.raises(ValueError, match="content_type"):
        put_bytes(local_store, new_key(), b"x", "text/html\r\nSet-Cookie: a=b")


def test_local_delete_many_removes_exactly_the_listed_keys(local_store: LocalResultStore) -> None:
    keys = [new_key() for _ in range(3)]
    for key in keys:
        put_bytes(local_store, key, key.encode(), None)
    url, _ = local_store.signed_url(keys[0], ttl_seconds=60)

    assert local_store.delete_many([keys[0], new_key(), keys[2], keys[0]]) == 3

    assert local_store.head(keys[0]) is None and local_store.head(keys[2]) is None
    assert local_store.read_bytes(keys[1]) == keys[1].encode()
    assert not os.path.exists(local_store.root / (keys[0] + ".meta.json"))
    assert requests.get(url, timeout=60).status_code == 404


def test_local_router_documents_its_responses(local_store: LocalResultStore) -> None:
    app = FastAPI()
    app.include_router(local_results_router(local_store))
    responses = app.openapi()["paths"]["/results/{path}"]["get"]["responses"]
    assert {"200", "403", "404"} <= set(responses)
    assert responses["403"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Problem"
    }
    # Bytes of any type, typed so generated clients hand them over.
    assert responses["200"]["content"]["application/octet-stream"]["schema"] == {
        "type": "string",
        "format": "binary",
    }


def test_a_hung_s3_store_fails_the_put_instead_of_holding_the_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that accepts connections and never answers: the put gives up after the
    client's read timeout (its retries included) and raises, so the worker records a
    transient failure and frees the slot, instead of botocore's 60 s × 5 attempts."""
    from botocore.exceptions import ReadTimeoutError

    from faults.proxy import FaultProxy
    from pin_orchestration.scraping.store import results as store_module

    monkeypatch.setattr(store_module, "S3_READ_TIMEOUT_SECONDS", 0.3)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with FaultProxy("127.0.0.1", 9) as hung:  # upstream never used: every call hangs
        hung.set_mode("hang")
        client = store_module.s3_client(
            endpoint_url=f"http://{hung.address}", region_name="us-east-1"
        )
        assert client.meta.config.read_timeout == 0.3
        with pytest.raises(ReadTimeoutError):
            S3ResultStore(client, "results").put(
                "k/1",
                io.BytesIO(b"x"),
                size=1,
                sha256=hashlib.sha256(b"x").hexdigest(),
                content_type="text/plain",
            )


def test_local_put_on_a_full_disk_leaves_the_old_object_and_no_temporary_file(
    local_store: LocalResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC halfway through a body (os.write, as the put writes it) or at the sidecar: the
    put raises, the object is what it was (absent, or the earlier put's), and nothing of the
    failed put is left in the directory to fill the disk further."""
    key = new_key()
    final = local_store.root / key
    real_write = os.write
    budget = {"bytes": 0}

    def full_disk(fd: int, data: Any) -> int:
        if budget["bytes"] <= 0:
            raise OSError(28, "No space left on device")
        written = real_write(fd, bytes(data)[: budget["bytes"]])
        budget["bytes"] -= written
        return written

    monkeypatch.setattr(os, "write", full_disk)
    for room in (0, MIB, len(BIG_BODY)):  # the body's first byte, its middle, the sidecar
        budget["bytes"] = room
        with pytest.raises(OSError, match="No space"):
            put_bytes(local_store, key, BIG_BODY, "text/plain")
        assert local_store.head(key) is None
        assert [p.name for p in final.parent.iterdir()] == []
    monkeypatch.setattr(os, "write", real_write)
    put_bytes(local_store, key, b"good", "text/plain")
    monkeypatch.setattr(os, "write", full_disk)
    budget["bytes"] = MIB
    with pytest.raises(OSError, match="No space"):
        put_bytes(local_store, key, BIG_BODY, None)
    monkeypatch.setattr(os, "write", real_write)
    assert local_store.read_bytes(key) == b"good"
    assert local_store.head(key) == StoredObject(key, 4, sha256_hex(b"good"), "text/plain")
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name, final.name + ".meta.json"]


# A worker killed in the middle of a put: the body's first chunk written to its temporary
# file, then the body holds until the process is killed (SIGKILL: no cleanup runs).
_PUT_KILLED_MIDWAY = """
import io, sys, threading
from pathlib import Path
from pin_orchestration.scraping.store.local import LocalResultStore

class FirstChunkThenHold(io.RawIOBase):
    def __init__(self):
        self.sent = False
    def readable(self):
        return True
    def read(self, n=-1):
        if not self.sent:
            self.sent = True
            return b"x" * 1000
        threading.Event().wait()

root, key = Path(sys.argv[1]), sys.argv[2]
store = LocalResultStore(root, public_base_url="http://127.0.0.1:1", signing_key=b"k" * 32)
store.put(key, FirstChunkThenHold(), size=10**6, sha256="0" * 64, content_type=None)
"""


def test_deleting_a_key_removes_what_a_put_killed_midway_left_of_it(
    local_store: LocalResultStore,
) -> None:
    """A put killed between its temporary file and the rename leaves that file (a dot-name,
    invisible as an object) in the job's directory; deleting the key (retention deletes
    the keys of every attempt of a job) removes it too, and nothing of another key."""
    key = new_key()
    final = local_store.root / key
    other = key[: -len(final.name)] + final.name + "0"  # attempt 10 beside attempt 1
    put_bytes(local_store, other, b"other", None)
    worker = subprocess.Popen(
        [sys.executable, "-c", _PUT_KILLED_MIDWAY, str(local_store.root), key]
    )
    try:
        deadline = time.monotonic() + 60
        while not any(
            p.name.startswith(f".{final.name}.") and p.stat().st_size
            for p in final.parent.iterdir()
        ):
            assert worker.poll() is None, "the put ended before it was killed"
            assert time.monotonic() < deadline, "the put never wrote its temporary file"
            time.sleep(0.05)
    finally:
        worker.kill()
        worker.wait()
    assert local_store.head(key) is None
    assert local_store.delete_many([key]) == 1
    assert sorted(p.name for p in final.parent.iterdir()) == sorted(
        [Path(other).name, Path(other).name + ".meta.json"]
    )
    assert local_store.read_bytes(other) == b"other"


class _FirstChunkThenWait(io.RawIOBase):
    """A body whose first `first` bytes come at once and the rest once `release` is set."""

    def __init__(self, data: bytes, first: int) -> None:
        self.data, self.first, self.pos = data, first, 0
        self.release = threading.Event()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.pos >= self.first:
            assert self.release.wait(30)
        end = len(self.data) if self.pos >= self.first else self.first
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk


def test_a_put_under_way_when_its_key_is_deleted_leaves_no_temporary(
    local_store: LocalResultStore,
) -> None:
    """A late put of a key retention deletes meanwhile (a worker whose lease was lost, still
    writing): the delete takes its temporary file; the put then fails, and leaves nothing
    (its sidecar's temporary included) in the directory."""
    key = new_key()
    final = local_store.root / key
    data = b"y" * 3000
    body = _FirstChunkThenWait(data, 1000)
    outcome: list[BaseException | StoredObject] = []

    def put() -> None:
        try:
            outcome.append(
                local_store.put(
                    key, body, size=len(data), sha256=sha256_hex(data), content_type=None
                )
            )
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=put)
    worker.start()
    deadline = time.monotonic() + 30
    while not (final.parent.is_dir() and any(final.parent.iterdir())):
        assert time.monotonic() < deadline, "the put never wrote its temporary file"
        time.sleep(0.01)
    assert local_store.delete_many([key]) == 1  # the body's temporary, mid-write
    body.release.set()
    worker.join(30)
    assert isinstance(outcome[0], FileNotFoundError), outcome
    assert local_store.head(key) is None
    assert sorted(p.name for p in final.parent.iterdir()) == []


def test_deleting_the_pre_0012_keys_of_a_day_lists_the_day_once(
    local_store: LocalResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes each swept job's pre-0012 key, `…/{day}/{job}`, whose directory is
    the tenant's day: its temporaries are looked for with one listing of it per batch, not
    one per key (a batch of 5,000 jobs of one busy day)."""
    tenant, day = uuid.uuid4(), datetime.now(UTC)
    jobs = [uuid.uuid4() for _ in range(40)]
    for job in jobs:
        put_bytes(local_store, result_key(tenant, job, day, 1), b"r", None)
    listed = 0
    real_listdir = os.listdir

    def counting_listdir(path: Any = ".") -> list[str]:
        nonlocal listed
        entries = real_listdir(path)
        listed += len(entries)
        return entries

    monkeypatch.setattr(os, "listdir", counting_listdir)
    local_store.delete_many([result_key(tenant, job, day, 1).rsplit("/", 1)[0] for job in jobs])
    monkeypatch.setattr(os, "listdir", real_listdir)
    assert listed <= 2 * len(jobs)
    for job in jobs:  # the attempts' objects under the jobs' folders stay
        assert local_store.read_bytes(result_key(tenant, job, day, 1)) == b"r"
