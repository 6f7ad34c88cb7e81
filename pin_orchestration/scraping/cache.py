"""The read cache of `GET /jobs/{id}` (seed step 19, SPEC SCR-14): cache-aside in Redis.

The API looks in Redis first; on a miss it reads PostgreSQL and stores the answer. Writers
(intake, workers, the sweeper, the runbook) never touch the cache: a trigger on
scraping.jobs NOTIFYs `scraping_job_finished` when a job enters or leaves a terminal status
(migration 0008), and `InvalidationListener`, a thread of the API process, drops the key.

- Key `job:{tenant}:{id}`: a tenant's lookup can only ever find its own jobs.
- TTL: SHORT_TTL_SECONDS while the job is not terminal; once terminal,
  `PIN_CACHE_TERMINAL_TTL_SECONDS` (an hour: the cache holds about an hour of finished
  jobs, not a month), and never past its results' retention (`PIN_RESULT_RETENTION_DAYS`
  from the job's acceptance) — but only while the listener is connected, since a
  long-lived copy is safe only if its invalidation cannot be missed.
- Invalidation writes a short-lived tombstone instead of deleting, and fills use SET NX:
  a reader that read the row just before the job finished and stores it just after the
  event cannot overwrite the tombstone with the stale status (the cache-aside race the
  seed leaves to the short TTL).
- Missed events: each time the listener (re)connects it drops every `job:*` key before it
  trusts long TTLs again; an invalidation that could not be written (Redis unreachable)
  turns the cache off for reads until such a flush succeeds.
- Redis down never fails a request: short socket timeouts, no retries, and after an error
  the cache is skipped for BREAKER_SECONDS, so a dead Redis costs one timeout per second,
  not one per request.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

CHANNEL = "scraping_job_finished"
SHORT_TTL_SECONDS = 2.0
# Redis on the same host or network answers in well under a millisecond.
SOCKET_TIMEOUT_SECONDS = 0.05
BREAKER_SECONDS = 1.0
KEY_PATTERN = "job:*"
# How long a finished job's copy is kept by default (PIN_CACHE_TERMINAL_TTL_SECONDS).
TERMINAL_TTL_SECONDS = 3600.0
# Marks a key invalidated a moment ago; lives as long as a non-terminal copy would.
TOMBSTONE = b"-"


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int  # answered from PostgreSQL (Redis skipped or failing included)
    errors: int  # Redis calls that failed
    invalidations: int  # finish events applied

    @property
    def hit_ratio(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0


def job_key(tenant_id: uuid.UUID, job_id: uuid.UUID) -> str:
    return f"job:{tenant_id}:{job_id}"


class JobCache:
    """Redis cache of job views (the JSON body of `GET /jobs/{id}`); thread-safe."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        retention_seconds: float,
        terminal_ttl_seconds: float = TERMINAL_TTL_SECONDS,
        short_ttl_seconds: float = SHORT_TTL_SECONDS,
        breaker_seconds: float = BREAKER_SECONDS,
    ) -> None:
        self._redis = client
        self.retention_seconds = retention_seconds
        self.terminal_ttl_seconds = terminal_ttl_seconds
        self.short_ttl_seconds = short_ttl_seconds
        self._breaker_seconds = breaker_seconds
        self._lock = threading.Lock()
        self._skip_until = 0.0
        self._flush_pending = self._flush_failing = False
        self._hits = self._misses = self._errors = self._invalidations = 0
        # Set while the invalidation listener is connected and has flushed: long TTLs are
        # safe only then.
        self.invalidation_live = threading.Event()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        retention_seconds: float,
        terminal_ttl_seconds: float = TERMINAL_TTL_SECONDS,
    ) -> JobCache:
        client = redis.Redis.from_url(
            url,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
            # redis-py retries with backoff by default: a dead Redis would then cost
            # seconds per request. A failed call is a miss; the breaker does the rest.
            retry=Retry(NoBackoff(), 0),
        )
        return cls(
            client, retention_seconds=retention_seconds, terminal_ttl_seconds=terminal_ttl_seconds
        )

    # --- reads and fills (the API's request threads) -----------------------------------

    def get(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> bytes | None:
        """The cached body, or None (a miss: read PostgreSQL, then `put`)."""
        body: bytes | None = None
        if self._usable():
            try:
                body = self._redis.get(job_key(tenant_id, job_id))  # type: ignore[assignment]
            except redis.RedisError as exc:
                self._failed("get", exc)
        with self._lock:
            if body is None or body == TOMBSTONE:
                self._misses += 1
                return None
            self._hits += 1
            return body

    def put(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID,
        body: bytes,
        *,
        terminal: bool,
        created_at: datetime,
    ) -> bool:
        """Store a body read from PostgreSQL unless the key exists (a fresher fill, or a
        tombstone: the job changed since). True when stored."""
        if not self._usable():
            return False
        ttl = self.short_ttl_seconds
        if terminal and self.invalidation_live.is_set():
            age = (datetime.now(UTC) - created_at).total_seconds()
            ttl = max(ttl, min(self.terminal_ttl_seconds, self.retention_seconds - age))
        try:
            stored = self._redis.set(
                job_key(tenant_id, job_id), body, px=max(1, int(ttl * 1000)), nx=True
            )
        except redis.RedisError as exc:
            self._failed("put", exc)
            return False
        return bool(stored)

    def ttl_seconds(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> float | None:
        """Remaining TTL of a cached key (None if absent); for tests and operators."""
        ms = self._redis.pttl(job_key(tenant_id, job_id))
        return None if ms is None or ms < 0 else ms / 1000  # type: ignore[operator]

    # --- invalidation (the listener thread) --------------------------------------------

    def invalidate(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> None:
        try:
            self._redis.set(
                job_key(tenant_id, job_id), TOMBSTONE, px=int(self.short_ttl_seconds * 1000)
            )
        except redis.RedisError as exc:
            # This copy may now be stale for as long as its TTL: stop serving hits until
            # every key has been dropped.
            with self._lock:
                self._flush_pending = True
            self._failed("invalidate", exc)
        with self._lock:
            self._invalidations += 1

    def forget_all(self) -> bool:
        """Drop every cached job (events may have been missed). False if Redis failed;
        reads then bypass the cache until a later call succeeds."""
        try:
            batch: list[bytes] = []
            for key in self._redis.scan_iter(match=KEY_PATTERN, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    self._redis.unlink(*batch)
                    batch.clear()
            if batch:
                self._redis.unlink(*batch)
        except redis.RedisError as exc:
            with self._lock:
                self._flush_pending = True
                self._errors += 1
                first, self._flush_failing = not self._flush_failing, True
            if first:  # the listener retries every poll: say it once
                log.warning("job cache: dropping cached jobs failed (%s); reads bypass it", exc)
            return False
        with self._lock:
            self._flush_pending = self._flush_failing = False
            self._skip_until = 0.0
        return True

    def require_flush(self) -> None:
        """Bypass the cache until `forget_all` succeeds (before the listener's first
        connect: copies left from a previous process may have missed events)."""
        with self._lock:
            self._flush_pending = True

    @property
    def flush_pending(self) -> bool:
        with self._lock:
            return self._flush_pending

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._errors, self._invalidations)

    # --- internals ---------------------------------------------------------------------

    def _usable(self) -> bool:
        with self._lock:
            return not self._flush_pending and time.monotonic() >= self._skip_until

    def _failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            self._errors += 1
            first = time.monotonic() >= self._skip_until
            self._skip_until = time.monotonic() + self._breaker_seconds
        if first:
            log.warning("job cache: Redis %s failed (%s); reading PostgreSQL", what, exc)


class InvalidationListener:
    """LISTEN scraping_job_finished on a connection of its own; each event invalidates
    the job's key. Reconnects after any failure, flushing the cache each time."""

    def __init__(
        self,
        conninfo: str,
        cache: JobCache,
        *,
        poll_seconds: float = 0.5,
        reconnect_seconds: float = 1.0,
    ) -> None:
        self._conninfo = conninfo
        self._cache = cache
        self._poll_seconds = poll_seconds
        self._reconnect_seconds = reconnect_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._cache.require_flush()
        self._thread = threading.Thread(
            target=self._run, name="job-cache-invalidation", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    # Events sent while nobody listened are gone: start from an empty cache.
                    self._cache.forget_all()
                    self._cache.invalidation_live.set()
                    while not self._stop.is_set():
                        for event in conn.notifies(timeout=self._poll_seconds):
                            self._apply(event.payload)
                        if self._cache.flush_pending:
                            self._cache.forget_all()
            except Exception as exc:  # any failure: reconnect, never die
                if not self._stop.is_set():
                    log.warning("job cache listener: %s; reconnecting", exc)
            finally:
                # Until the next connect has flushed, events are being missed: bypass.
                self._cache.invalidation_live.clear()
                self._cache.require_flush()
            self._stop.wait(self._reconnect_seconds)

    def _apply(self, payload: str) -> None:
        try:
            event = json.loads(payload)
            tenant_id, job_id = uuid.UUID(event["tenant_id"]), uuid.UUID(event["job_id"])
        except (ValueError, KeyError, TypeError):
            log.warning("job cache listener: ignoring malformed event %r", payload)
            return
        self._cache.invalidate(tenant_id, job_id)
