"""`LocalResultStore`, the embedded default results store (SCR-10): files under `PIN_HOME`,
one per key with a metadata sidecar, and expiring URLs signed with an HMAC key kept beside
them, which the API serves (`api/store_routes.local_results_router`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import io
import itertools
import json
import math
import os
import re
import secrets
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from pin_orchestration.platform.settings import Settings
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store.results import (
    COPY_CHUNK_BYTES,
    META_SUFFIX,
    RESULTS_PREFIX,
    SIGNING_KEY_BYTES,
    ResultStore,
    S3ResultStore,
    StoredObject,
    check_put_arguments,
    s3_client,
    unique_keys,
    validate_key,
)


def load_or_create_signing_key(path: Path) -> bytes:
    """The local store's HMAC key: 32 random bytes in a 0600 file, created on first use.

    Reused after restarts, so URLs handed out before a restart keep working. Safe when the
    API and several worker processes start at once: the key is written to a temporary file
    and published with link(2), which fails if another process published first.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(SIGNING_KEY_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            os.unlink(temporary)
        _fsync_directory(path.parent)
    key = path.read_bytes()
    if len(key) != SIGNING_KEY_BYTES:
        raise ValueError(
            f"{path} holds {len(key)} bytes, not a {SIGNING_KEY_BYTES}-byte signing key; "
            "delete it to create a new one (links handed out before stop working)"
        )
    return key


class LocalResultStore:
    """Files under `root`, one per key, each with a `<key>.meta.json` sidecar.

    An object exists once its sidecar does: the body is published first, then the
    sidecar, each by an atomic rename of a fsynced temporary file in the same directory,
    so a crash leaves either nothing or a body without a sidecar (absent, replaced by the
    next put), never a partial file under a key's name.
    """

    def __init__(self, root: Path, *, public_base_url: str, signing_key: bytes) -> None:
        if len(signing_key) < 16:
            raise ValueError("signing_key must be at least 16 bytes")
        if not public_base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"public_base_url must be an http(s):// URL of the API (got {public_base_url!r})"
            )
        self.root = root
        self._root = os.fspath(root)
        self.public_base_url = public_base_url.rstrip("/")
        self._signing_key = signing_key

    def _paths(self, key: str) -> tuple[Path, Path]:
        validate_key(key)
        path = self.root.joinpath(*key.split("/"))
        return path, path.with_name(path.name + META_SUFFIX)

    def put(
        self, key: str, body: BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> StoredObject:
        # Plain os calls on str paths: a worker puts every job's body here, and pathlib,
        # tempfile's random names and buffered file objects cost more than the writes.
        validate_key(key)
        recorded_type = check_put_arguments(size, sha256, content_type)
        path = os.path.join(self._root, *key.split("/"))
        directory, name = os.path.split(path)
        _make_directories(directory)
        meta = json.dumps({"size": size, "sha256": sha256, "content_type": recorded_type})
        body_temporary = _write_temporary(directory, name, body, size=size, sha256=sha256)
        try:
            meta_temporary = _write_temporary(
                directory, name + META_SUFFIX, io.BytesIO(meta.encode())
            )
        except BaseException:
            _remove(body_temporary)
            raise
        # Two writers of one key must not leave one's body beside the other's sidecar.
        fd = os.open(directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.replace(body_temporary, path)
            os.replace(meta_temporary, path + META_SUFFIX)
            # The renames are durable once the directory's own data is.
            os.fsync(fd)
        except BaseException:
            _remove(body_temporary)
            _remove(meta_temporary)
            raise
        finally:
            os.close(fd)  # closing releases the lock
        # And so is the directory, once its entry in its parent is, up to the root.
        parts = key.split("/")[:-1]
        _DIRECTORIES.make_durable(
            directory, [os.path.join(self._root, *parts[:n]) for n in range(len(parts) - 1, -1, -1)]
        )
        return StoredObject(key=key, size=size, sha256=sha256, content_type=recorded_type)

    def head(self, key: str) -> StoredObject | None:
        path, meta_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            return None
        if not path.is_file():
            return None
        return StoredObject(
            key=key, size=meta["size"], sha256=meta["sha256"], content_type=meta["content_type"]
        )

    def open(self, key: str) -> tuple[Path, StoredObject] | None:
        """The file that holds the object and its metadata, or None when absent."""
        stored = self.head(key)
        if stored is None:
            return None
        return self._paths(key)[0], stored

    def signed_url(
        self, key: str, *, ttl_seconds: float, now: datetime | None = None
    ) -> tuple[str, datetime]:
        """`{public_base_url}/{key}?expires={unix}&signature={hex}` (keys start with
        `results/`), valid until `expires` (whole seconds, rounded up from now + ttl)."""
        validate_key(key)
        if not key.startswith(RESULTS_PREFIX):
            raise ValueError(f"the local store links only keys under {RESULTS_PREFIX}: {key!r}")
        if not ttl_seconds > 0:
            raise ValueError(
                f"ttl_seconds must be > 0 (got {ttl_seconds!r}); see PIN_RESULT_URL_TTL_SECONDS"
            )
        signed_at = datetime.now(UTC) if now is None else now
        expires = math.ceil(signed_at.timestamp() + ttl_seconds)
        url = (
            f"{self.public_base_url}/{quote(key, safe='/')}"
            f"?expires={expires}&signature={self._signature(key, expires)}"
        )
        return url, datetime.fromtimestamp(expires, UTC)

    def verify(
        self, key: str, expires: int, signature: str, *, now: datetime | None = None
    ) -> bool:
        """True when `signature` is this store's signature of (key, expires) and `now` is
        before `expires`. Never raises on bad input: a malformed key or signature is False."""
        try:
            validate_key(key)
        except ValueError:
            return False
        expected = self._signature(key, expires).encode()
        # Constant time, so response timing reveals nothing about the right signature.
        if not hmac.compare_digest(expected, signature.encode("utf-8", "replace")):
            return False
        checked_at = datetime.now(UTC) if now is None else now
        return checked_at.timestamp() < expires

    def _signature(self, key: str, expires: int) -> str:
        # NUL cannot occur in a key, so (key, expires) pairs map to distinct messages.
        message = b"pin-result-url-v1\x00" + key.encode() + b"\x00" + str(expires).encode()
        return hmac.new(self._signing_key, message, hashlib.sha256).hexdigest()

    def delete_many(self, keys: Sequence[str]) -> int:
        unique = unique_keys(keys)
        by_directory: dict[Path, list[tuple[Path, Path]]] = {}
        for key in unique:
            path, meta_path = self._paths(key)
            by_directory.setdefault(path.parent, []).append((path, meta_path))
        for directory, paths in by_directory.items():
            if not directory.is_dir():
                continue
            with _locked_directory(directory):
                for path, meta_path in paths:
                    # Sidecar first: from that moment the object reads as absent.
                    meta_path.unlink(missing_ok=True)
                    # A directory under a key's name holds other keys (a job's pre-0012 key
                    # is the folder of its attempts' objects): no object by that name exists.
                    if not path.is_dir():
                        path.unlink(missing_ok=True)
                # And what puts of these keys killed midway left, with one listing of the
                # directory (a day's, for pre-0012 keys). A put still under way (a worker
                # whose lease was lost) then fails and removes its own files.
                names = {path.name for path, _ in paths}
                for temporary in _temporaries_of(os.fspath(directory), names):
                    _remove(temporary)
        return len(unique)

    def read_bytes(self, key: str) -> bytes:
        opened = self.open(key)
        if opened is None:
            raise FileNotFoundError(f"no result stored under {key!r} in {self.root}")
        return opened[0].read_bytes()


# Directories whose entry this process knows to be durable, at most (one forgotten is
# synced again).
_DURABLE_KEPT = 1024


class _DurableDirectories:
    """Makes directories' entries durable: a new directory is an entry in its parent's
    data, lost with what it holds if the machine stops before that is written (ext4 without
    a journal puts it in lost+found). An entry is durable once a fsync of the parent that
    began after the entry was made has ended; one such sync serves every put that needed
    it meanwhile (the day's directory gets a new job directory with every put)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._syncs_begun = 0
        # directory → the number of its last sync that ended; those under way
        self._synced: OrderedDict[str, int] = OrderedDict()
        self._syncing: set[str] = set()
        self._durable: OrderedDict[str, None] = OrderedDict()

    def make_durable(self, directory: str, ancestors: list[str]) -> None:
        """Return once the entries of `directory` and of its `ancestors` (each there now)
        are durable: `directory`'s always synced (a put's own, or made by the job's
        earlier attempt: not remembered), its ancestors' when not known to be."""
        with self._changed:
            since = self._syncs_begun
            unknown = [d for d in ancestors if d not in self._durable]
        for entry in (directory, *unknown):
            self._sync(os.path.dirname(entry), since)
        with self._changed:
            for entry in unknown:
                self._durable[entry] = None
            while len(self._durable) > _DURABLE_KEPT:
                self._durable.popitem(last=False)

    def _sync(self, directory: str, since: int) -> None:
        """Return once a fsync of `directory` begun after sync number `since` has ended."""
        with self._changed:
            while self._synced.get(directory, 0) <= since:
                if directory in self._syncing:
                    self._changed.wait()
                    continue
                self._syncs_begun += 1
                number = self._syncs_begun
                self._syncing.add(directory)
                try:
                    self._changed.release()
                    try:
                        _fsync_directory(directory)
                    finally:
                        self._changed.acquire()
                    self._synced[directory] = max(number, self._synced.get(directory, 0))
                    self._synced.move_to_end(directory)
                    while len(self._synced) > _DURABLE_KEPT:
                        self._synced.popitem(last=False)
                finally:
                    self._syncing.discard(directory)
                    self._changed.notify_all()


_DIRECTORIES = _DurableDirectories()


def _make_directories(directory: str) -> None:
    try:
        os.mkdir(directory)
    except FileExistsError:
        return
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)


# Temporary names are this process's id and a count: unique without random bytes, and a
# name left by a killed process of the same id is skipped (O_EXCL).
_temporary_numbers = itertools.count()
# What `_write_temporary` names a temporary file of the object (or sidecar) `name`: the
# suffix holds two dots, so an entry splits into name and suffix one way only.
_TEMPORARY = re.compile(r"\.(.+)\.[0-9]+-[0-9]+\.tmp", re.DOTALL)


def _temporaries_of(directory: str, names: set[str]) -> list[str]:
    """The temporary files of the objects `names` in `directory` (bodies' and sidecars';
    `_write_temporary` names them), with one listing of the directory."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry)
        if match is None:
            continue
        name = match.group(1)  # no key ends with META_SUFFIX: a sidecar's is its object's
        if name.endswith(META_SUFFIX):
            name = name[: -len(META_SUFFIX)]
        if name in names:
            found.append(os.path.join(directory, entry))
    return found


def _write_temporary(
    directory: str,
    name: str,
    body: BinaryIO,
    *,
    size: int | None = None,
    sha256: str | None = None,
) -> str:
    """Copy `body` into a fsynced temporary file in `directory` (a dot-name no key can
    have), checking size and digest; its path."""
    while True:
        temporary = os.path.join(directory, f".{name}.{os.getpid()}-{next(_temporary_numbers)}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    try:
        try:
            digest = hashlib.sha256()
            written = 0
            while chunk := body.read(COPY_CHUNK_BYTES):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                digest.update(chunk)
                written += len(chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        if size is not None and written != size:
            raise ValueError(f"body has {written} bytes, not the declared size {size}")
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ValueError(
                f"body sha256 is {digest.hexdigest()}, not the declared sha256 {sha256}"
            )
    except BaseException:
        _remove(temporary)
        raise
    return temporary


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def _locked_directory(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _fsync_directory(directory: Path) -> None:
    """Make renames in `directory` durable: a rename lives in the directory's own data."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_result_store(
    *,
    bucket: str | None,
    endpoint_url: str | None,
    region_name: str | None,
    home: Path,
    public_base_url: str,
) -> ResultStore:
    """S3 when a bucket is configured (PIN_S3_BUCKET), else the embedded directory store."""
    if bucket:
        return S3ResultStore(s3_client(endpoint_url=endpoint_url, region_name=region_name), bucket)
    return LocalResultStore(
        home / "results",
        public_base_url=public_base_url,
        signing_key=load_or_create_signing_key(home / "results-signing.key"),
    )


def result_store_from(settings: ScrapingSettings) -> ResultStore:
    """The store the settings name (PIN_S3_*; else the directory under PIN_HOME)."""
    return build_result_store(
        bucket=settings.s3_bucket,
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        home=Settings.from_env().home,
        public_base_url=settings.api_public_url,
    )
