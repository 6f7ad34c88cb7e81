"""The read cache of `GET /jobs/{id}` (seed step 19, SPEC SCR-14): cache-aside in Redis.

The API looks in Redis first; on a miss it reads PostgreSQL and stores the answer. Writers
(intake, workers, the sweeper, the runbook) never touch the cache: a trigger on
scraping.jobs NOTIFYs `scraping_job_finished` when a job enters or leaves a terminal status
(migration 0008), and `InvalidationListener`, a thread of the API process, invalidates
the key.

- Key `job:{epoch}:{tenant}:{id}`: a tenant's lookup can only ever find its own jobs;
  the epoch is this process's (below).
- TTL: SHORT_TTL_SECONDS while the job is not terminal; once terminal,
  `PIN_CACHE_TERMINAL_TTL_SECONDS` (an hour: the cache holds about an hour of finished
  jobs, not a month), and never past its results' retention (`PIN_RESULT_RETENTION_DAYS`
  from the job's acceptance) — but only while the listener is connected, since a
  long-lived copy is safe only if its invalidation cannot be missed.
- Versions: a value is the row's `updated_at` (microseconds) and the body. Invalidation
  writes a tombstone of the event's `updated_at` (migration 0016); a fill is a
  compare-and-set that never replaces a newer version, so a reader that read the row
  before the event and stores it after cannot bring the old status back, while the row as
  the event left it is cached at once. The tombstone lives as long as a terminal copy; a
  fill whose read took longer than half that is dropped: the tombstone it should have met
  may have expired.
- Missed events: each time the listener (re)connects, and when an invalidation could not
  be written (Redis unreachable), this process starts a new epoch. Its earlier copies are
  never read again and expire by TTL; other API processes' keys are untouched, so a
  rolling restart empties no one else's cache. Each process fills its own copies.
- Redis down never fails a request: short socket timeouts, no retries, and after an error
  the cache is skipped for BREAKER_SECONDS, so a dead Redis costs one timeout per second,
  not one per request.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

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
# How long a finished job's copy is kept by default (PIN_CACHE_TERMINAL_TTL_SECONDS).
TERMINAL_TTL_SECONDS = 3600.0


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


def job_key(epoch: str, tenant_id: uuid.UUID, job_id: uuid.UUID) -> str:
    return f"job:{epoch}:{tenant_id}:{job_id}"


def version_of(updated_at: datetime) -> int:
    """A job's `updated_at` as whole microseconds since the epoch, exact (a float would
    round them)."""
    return (updated_at - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# A value is `{version}\n{body}`; an empty body is a tombstone. Store the fill unless the
# key holds a newer version, or the same version already filled (a tombstone at that
# version is the event that produced the row read: the fill is the state after it).
_FILL_SCRIPT = """
local current = redis.call('GET', KEYS[1])
if current then
    local newline = string.find(current, '\\n', 1, true)
    if newline then
        local held = tonumber(string.sub(current, 1, newline - 1))
        local filling = tonumber(ARGV[1])
        if held > filling or (held == filling and newline < #current) then
            return 0
        end
    end
end
redis.call('SET', KEYS[1], ARGV[1] .. '\\n' .. ARGV[2], 'PX', ARGV[3])
return 1
"""


def new_epoch() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class CacheRead:
    """What `JobCache.get` found, and what `put` needs to know of the moment it looked."""

    tenant_id: uuid.UUID
    job_id: uuid.UUID
    body: bytes | None  # None: a miss, read PostgreSQL then `put`
    epoch: str | None  # the keys looked at; None: the cache was not usable
    long_ttl_allowed: bool  # the listener was connected (and stays so while epoch holds)
    looked_at: float  # monotonic, before the row was read


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
        self._fill = client.register_script(_FILL_SCRIPT)
        self.retention_seconds = retention_seconds
        self.terminal_ttl_seconds = terminal_ttl_seconds
        self.short_ttl_seconds = short_ttl_seconds
        # A tombstone blocks only fills older than its event, so it may live as long as the
        # copies it guards against: a stalled reader then has that long before it is
        # refused (see `put`).
        self.tombstone_ttl_seconds = max(short_ttl_seconds, terminal_ttl_seconds)
        self._breaker_seconds = breaker_seconds
        self._lock = threading.Lock()
        self._skip_until = 0.0
        self._epoch: str | None = new_epoch()
        self._hits = self._misses = self._errors = self._invalidations = 0
        # Set while the invalidation listener is connected: long TTLs are safe only then.
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

    @property
    def epoch(self) -> str | None:
        """This process's key prefix now; None while the listener is reconnecting."""
        with self._lock:
            return self._epoch

    # --- reads and fills (the API's request threads) -----------------------------------

    def get(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> CacheRead:
        """The cached body, or a miss to fill with `put` once PostgreSQL has answered."""
        looked_at = time.monotonic()
        with self._lock:
            epoch = self._epoch if looked_at >= self._skip_until else None
            long_ttl_allowed = self.invalidation_live.is_set()
        value: bytes | None = None
        if epoch is not None:
            try:
                value = self._redis.get(job_key(epoch, tenant_id, job_id))  # type: ignore[assignment]
            except redis.RedisError as exc:
                self._failed("get", exc)
        body = value.partition(b"\n")[2] if value else None
        with self._lock:
            if body:
                self._hits += 1
            else:
                self._misses += 1
        return CacheRead(tenant_id, job_id, body or None, epoch, long_ttl_allowed, looked_at)

    def put(
        self,
        read: CacheRead,
        body: bytes,
        *,
        terminal: bool,
        created_at: datetime,
        updated_at: datetime,
        not_after: datetime | None = None,
    ) -> bool:
        """Store a body read from PostgreSQL after `read` missed, unless Redis holds a newer
        version of the job. True when stored.

        Refused too when the epoch changed since (events may have been missed in between),
        or when the read took longer than half a tombstone's life: an event applied after
        the row was read leaves a tombstone that lives `tombstone_ttl_seconds`, and a fill
        that comes later could find it expired and store the state the event replaced.
        `not_after`: the copy expires then at the latest (when a queued job's wait lifts);
        one already past is not stored."""
        if read.epoch is None or read.epoch != self.epoch:
            return False
        if time.monotonic() - read.looked_at > self.tombstone_ttl_seconds / 2:
            return False
        ttl = self.short_ttl_seconds
        if terminal and read.long_ttl_allowed:
            age = (datetime.now(UTC) - created_at).total_seconds()
            ttl = max(ttl, min(self.terminal_ttl_seconds, self.retention_seconds - age))
        if not_after is not None:
            ttl = min(ttl, (not_after - datetime.now(UTC)).total_seconds())
            if ttl < 0.001:
                return False
        try:
            stored = self._fill(
                keys=[job_key(read.epoch, read.tenant_id, read.job_id)],
                args=[version_of(updated_at), body, max(1, int(ttl * 1000))],
            )
        except redis.RedisError as exc:
            self._failed("put", exc)
            return False
        return bool(stored)

    def ttl_seconds(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> float | None:
        """Remaining TTL of a key of the current epoch (None if absent); for tests and
        operators."""
        epoch = self.epoch
        if epoch is None:
            return None
        ms = self._redis.pttl(job_key(epoch, tenant_id, job_id))
        return None if ms is None or ms < 0 else ms / 1000  # type: ignore[operator]

    # --- invalidation (the listener thread) --------------------------------------------

    def invalidate(self, tenant_id: uuid.UUID, job_id: uuid.UUID, *, updated_at: datetime) -> None:
        """Replace the copy with a tombstone of the event's version: fills of older rows
        are refused while it lives, the row as the event left it may be stored at once."""
        epoch = self.epoch
        if epoch is not None:
            try:
                self._redis.set(
                    job_key(epoch, tenant_id, job_id),
                    b"%d\n" % version_of(updated_at),
                    px=int(self.tombstone_ttl_seconds * 1000),
                )
            except redis.RedisError as exc:
                # This copy may now be stale for as long as its TTL: stop serving every
                # copy of this epoch.
                self.begin_epoch()
                self._failed("invalidate", exc)
        with self._lock:
            self._invalidations += 1

    def begin_epoch(self) -> None:
        """Serve and fill new keys from now on (the listener has connected, or an
        invalidation was lost): copies under earlier epochs are never read again and expire
        by their TTL. Other API processes' keys are untouched."""
        with self._lock:
            self._epoch = new_epoch()

    def suspend(self) -> None:
        """Bypass the cache until `begin_epoch` (the listener is not connected: events are
        being missed)."""
        with self._lock:
            self._epoch = None

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._errors, self._invalidations)

    # --- internals ---------------------------------------------------------------------

    def _failed(self, what: str, exc: Exception) -> None:
        with self._lock:
            self._errors += 1
            first = time.monotonic() >= self._skip_until
            self._skip_until = time.monotonic() + self._breaker_seconds
        if first:
            log.warning("job cache: Redis %s failed (%s); reading PostgreSQL", what, exc)


class InvalidationListener:
    """LISTEN scraping_job_finished on a connection of its own; each event invalidates
    the job's key. Reconnects after any failure, with a new epoch each time."""

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
        self._cache.suspend()
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
                    # Events sent while nobody listened are gone: this process's earlier
                    # copies are never read again (other processes' stay).
                    self._cache.begin_epoch()
                    self._cache.invalidation_live.set()
                    while not self._stop.is_set():
                        for event in conn.notifies(timeout=self._poll_seconds):
                            self._apply(event.payload)
            except Exception as exc:  # any failure: reconnect, never die
                if not self._stop.is_set():
                    log.warning("job cache listener: %s; reconnecting", exc)
            finally:
                # Until the next connect, events are being missed: bypass.
                self._cache.invalidation_live.clear()
                self._cache.suspend()
            self._stop.wait(self._reconnect_seconds)

    def _apply(self, payload: str) -> None:
        try:
            event = json.loads(payload)
            tenant_id, job_id = uuid.UUID(event["tenant_id"]), uuid.UUID(event["job_id"])
            updated_at = datetime.fromisoformat(event["updated_at"])
        except (ValueError, KeyError, TypeError):
            log.warning("job cache listener: ignoring malformed event %r", payload)
            return
        self._cache.invalidate(tenant_id, job_id, updated_at=updated_at)
