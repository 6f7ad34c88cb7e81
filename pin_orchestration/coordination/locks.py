"""A distributed lock with a TTL, kept in PostgreSQL (ADR-0056: no Redis on PIN services).

A lock is a row in pin.distributed_locks. Acquiring never waits: it inserts the row, or
takes it over when the previous holder's TTL has expired. Operators see the holder and
its expiry in that table (`pin locks list`).

Every job that holds a lock while it works uses `renewed_lock`: a background thread pushes
the expiry out every third of the TTL while the work runs, and the moment a renewal fails
the lease is marked lost and the caller's `on_lost` runs (typically: set the work's stop
event), so the work stops at its next step instead of running on beside a second holder.

A hung server (or network) must not hang that judgement: each renewal runs under a
statement timeout and a client-side deadline, both a ninth of the TTL, and the lease
counts as confirmed only from the moment a renewal was *sent*; so a renewal that gets no
answer marks the lease lost before the TTL ends, whatever the socket does.

Each acquisition draws a fencing token (pin.distributed_locks.token). A step still in
flight when the lease is lost cannot be stopped from outside, so the writes that must
have one holder (the reconcile's checkpoint, the publisher's mark-published) take the
fence in their own transaction (`take_fence`, or the same condition inside one
statement): once another process took the lock over, a stale holder's write changes
nothing and the holder stops.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

log = logging.getLogger(__name__)

LOCK_NOT_AVAILABLE = "55P03"

# Every lock key starts so; a scheduled job's lock is this prefix and its job code (seeds).
LOCK_KEY_PREFIX = "Pin:lock:"
SCHEDULED_JOB_LOCK_PREFIX = "Pin:lock:job:scheduled:"

# A fenced write in flight key-share-locks the lock row: a takeover (it changes the token,
# a key column: UNIQUE) waits for it at most this long and then reports the lock as held,
# so acquiring never queues. A renewal changes no key column and never waits for it.
ACQUIRE_LOCK_TIMEOUT = "1s"

_ACQUIRE_LOCK_TIMEOUT = text("SELECT set_config('lock_timeout', :timeout, true)")
_ACQUIRE = text(
    """
    INSERT INTO pin.distributed_locks AS l (lock_key, holder, acquired_at, expires_at, token)
    VALUES (:key, :holder, now(), now() + make_interval(secs => :ttl), gen_random_uuid())
    ON CONFLICT (lock_key) DO UPDATE
        SET holder = excluded.holder,
            acquired_at = excluded.acquired_at,
            expires_at = excluded.expires_at,
            token = excluded.token
        WHERE l.expires_at <= now()
    RETURNING token
    """
)
# statement_timeout and lock_timeout for this transaction only; milliseconds. And how
# long the server keeps the transaction open while its client is silent: a renewal or a
# fenced write whose connection hangs between its statements (its COMMIT blackholed) holds
# the lock row, so no takeover could pass it until the server gave the session up; the
# server ends that session after the TTL instead, as it would a holder gone quiet.
_RENEWAL_TIMEOUTS = text(
    "SELECT set_config('statement_timeout', :ms, true), set_config('lock_timeout', :ms, true),"
    " set_config('idle_in_transaction_session_timeout', :ms, true)"
)
_IDLE_TIMEOUT = text("SELECT set_config('idle_in_transaction_session_timeout', :ms, true)")
_EXTEND = text(
    """
    UPDATE pin.distributed_locks
    SET expires_at = now() + make_interval(secs => :ttl)
    WHERE lock_key = :key AND token = :token AND expires_at > now()
    """
)
# The fence: the first statement of a transaction whose writes must have one holder. The
# key-share lock keeps a takeover out until that transaction ends (not a renewal); a
# takeover that committed first leaves another token here, so this finds nothing.
_FENCE = text(
    """
    SELECT 1 FROM pin.distributed_locks
    WHERE lock_key = :key AND token = :token AND expires_at > clock_timestamp()
    FOR KEY SHARE
    """
)
_RELEASE = text("DELETE FROM pin.distributed_locks WHERE lock_key = :key AND token = :token")
_FORCE_RELEASE = text("DELETE FROM pin.distributed_locks WHERE lock_key = :key")
_LIST = text(
    """
    SELECT lock_key, holder, acquired_at, expires_at, expires_at <= now() AS expired
    FROM pin.distributed_locks ORDER BY lock_key
    """
)


@dataclass(frozen=True)
class LockInfo:
    lock_key: str
    holder: str
    acquired_at: datetime
    expires_at: datetime
    expired: bool


def default_holder(run_id: str | None = None) -> str:
    """host:pid[:run] — enough for an operator to find the process that holds a lock."""
    holder = f"{socket.gethostname()}:{os.getpid()}"
    return f"{holder}:{run_id}" if run_id else holder


def try_acquire_lock(engine: Engine, key: str, ttl_seconds: float, holder: str) -> uuid.UUID | None:
    """Take the lock if it is free or expired; never waits. Returns the acquisition's
    fencing token when `holder` now holds it, None when someone else does."""
    try:
        with engine.begin() as conn:
            conn.execute(_ACQUIRE_LOCK_TIMEOUT, {"timeout": ACQUIRE_LOCK_TIMEOUT})
            return conn.execute(
                _ACQUIRE, {"key": key, "holder": holder, "ttl": ttl_seconds}
            ).scalar()
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return None  # a fenced write of the holder is in flight: the lock is held
        raise


def extend_lock(
    engine: Engine,
    key: str,
    ttl_seconds: float,
    token: uuid.UUID,
    *,
    timeout_seconds: float | None = None,
) -> bool:
    """Push the expiry out; False when the lock has expired or passed to someone else.
    `timeout_seconds` bounds the statement (and any lock wait) on the server."""
    with engine.begin() as conn:
        if timeout_seconds is not None:
            conn.execute(_RENEWAL_TIMEOUTS, {"ms": str(max(int(timeout_seconds * 1000), 1))})
        return conn.execute(_EXTEND, {"key": key, "token": token, "ttl": ttl_seconds}).rowcount == 1


def release_lock(engine: Engine, key: str, token: uuid.UUID) -> bool:
    """Release the acquisition `token`; a lock that passed to another holder is left alone."""
    with engine.begin() as conn:
        return conn.execute(_RELEASE, {"key": key, "token": token}).rowcount == 1


def force_release_lock(engine: Engine, key: str) -> str | None:
    """Runbook action for a stuck holder: drop the lock `key` whoever holds it; a name
    that is no held key is read as a job code (`news-comment-reconcile` → its scheduled
    job's lock), what an operator types. Returns the key released, None if none was."""
    candidates = [key]
    if not key.startswith(LOCK_KEY_PREFIX):
        candidates.append(SCHEDULED_JOB_LOCK_PREFIX + key)
    with engine.begin() as conn:
        for candidate in candidates:
            if conn.execute(_FORCE_RELEASE, {"key": candidate}).rowcount == 1:
                return candidate
    return None


def list_locks(engine: Engine) -> list[LockInfo]:
    with engine.connect() as conn:
        return [LockInfo(**row._mapping) for row in conn.execute(_LIST)]


class LockLost(RuntimeError):
    """The lock's renewal failed: another holder may have it now."""


@dataclass
class LockLease:
    """A lock taken by `renewed_lock`. `lost` is set once a renewal fails or a fenced
    write finds the lock gone; from then on the holder must not start another step."""

    key: str
    holder: str
    token: uuid.UUID | None  # None: not acquired
    on_lost: Callable[[], None] | None = None
    # The lock's TTL: a fenced transaction left idle longer is ended by the server.
    ttl_seconds: float | None = None
    lost: threading.Event = field(default_factory=threading.Event)

    @property
    def acquired(self) -> bool:
        return self.token is not None

    def check(self) -> None:
        """Raise LockLost when the lock was lost (call between steps)."""
        if self.lost.is_set():
            raise LockLost(f"lost the lock {self.key} (holder {self.holder}); stopped")

    def mark_lost(self, why: str) -> None:
        if self.lost.is_set():
            return
        log.error("lock %s lost by %s (%s): stopping the work", self.key, self.holder, why)
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost()


def end_transaction_idle_past(conn: Connection, seconds: float) -> None:
    """Have PostgreSQL end this transaction (and its session) once it has waited longer than
    `seconds` for the client's next statement: a client cut off mid-transaction (a hung
    network, a stalled process) must not hold its row locks past the moment another
    worker may take its work over (a lock's TTL, a claim's lease)."""
    conn.execute(_IDLE_TIMEOUT, {"ms": str(max(int(seconds * 1000), 1))})


def take_fence(conn: Connection, lease: LockLease) -> None:
    """The first statement of a transaction whose writes must have one holder: key-share-lock
    the lease's lock row, or — when the lock expired or passed to another holder — mark
    the lease lost and raise LockLost (the caller's transaction then rolls back)."""
    if lease.ttl_seconds is not None:
        end_transaction_idle_past(conn, lease.ttl_seconds)
    if conn.execute(_FENCE, {"key": lease.key, "token": lease.token}).first() is None:
        lease.mark_lost("a fenced write found the lock expired or taken over")
        lease.check()


def _attempt_renewal(
    engine: Engine, lease: LockLease, ttl_seconds: float, timeout_seconds: float
) -> tuple[bool | None, str]:
    """One renewal, given up after `timeout_seconds` on our side too: a server (or a
    network) that never answers leaves the attempt's thread waiting, not the lease's
    judgement. Returns (renewed, why): None when there was no answer or an error."""
    answer: list[tuple[bool | None, str]] = []

    def attempt() -> None:
        try:
            renewed = extend_lock(
                engine, lease.key, ttl_seconds, lease.token, timeout_seconds=timeout_seconds
            )
            answer.append((renewed, "it expired or passed to another holder"))
        except Exception as exc:  # noqa: BLE001 — a database hiccup; judged by the TTL
            answer.append((None, f"{type(exc).__name__}: {exc}"))

    # A daemon thread: one stuck on a dead socket must not keep a dying process alive.
    worker = threading.Thread(target=attempt, name=f"renew {lease.key}", daemon=True)
    worker.start()
    # The server's statement_timeout normally answers first; a little slack for its reply.
    worker.join(timeout_seconds * 1.5)
    if not answer:
        return None, f"no answer within {timeout_seconds:.2f} s"
    return answer[0]


def _keep_renewed(
    engine: Engine,
    lease: LockLease,
    ttl_seconds: float,
    every_seconds: float,
    confirmed_at: float,
    done: threading.Event,
    clock: Callable[[], float],
) -> None:
    """The renewal thread: extend every `every_seconds` until `done`; on failure mark the
    lease lost (which calls its `on_lost`) and end.

    `confirmed_at` is when the last successful statement was sent: the server stamped the
    expiry after that, so the lock is ours until at least `confirmed_at + ttl_seconds`.
    """
    timeout_seconds = every_seconds / 3
    while not done.wait(every_seconds):
        sent_at = clock()
        renewed, why = _attempt_renewal(engine, lease, ttl_seconds, timeout_seconds)
        if renewed:
            confirmed_at = sent_at
            continue
        # A transient failure is retried while the confirmed expiry still covers the next
        # attempt and its answer; past that we can no longer vouch that nobody else holds
        # the lock.
        next_answer_by = clock() + every_seconds + timeout_seconds * 1.5
        if renewed is None and next_answer_by < confirmed_at + ttl_seconds:
            log.warning("renewal of lock %s failed (%s); retrying", lease.key, why)
            continue
        lease.mark_lost(why)
        return


@contextmanager
def renewed_lock(
    engine: Engine,
    key: str,
    ttl_seconds: float,
    holder: str,
    *,
    on_lost: Callable[[], None] | None = None,
    renew_every_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[LockLease]:
    """Take the lock without waiting and keep it renewed while the block runs; release it
    on exit. Yields a lease whose `acquired` says whether the lock was taken.

    Renewal runs on a background thread rather than between the work's steps because a
    single step (a Kafka flush, an HTTP call, one batch statement) has no bound tied to the
    TTL: renewing only between steps is what let the publisher's lock expire under a long
    publish. The work still checks `lease.lost` (or its stop event, set by `on_lost`)
    between steps, since a thread cannot be stopped from outside mid-step.
    `renew_every_seconds` defaults to a third of the TTL, so a renewal may fail on a
    database hiccup before the lock can expire.
    """
    sent_at = clock()
    lease = LockLease(
        key,
        holder,
        try_acquire_lock(engine, key, ttl_seconds, holder),
        on_lost,
        ttl_seconds=ttl_seconds,
    )
    if not lease.acquired:
        yield lease
        return
    done = threading.Event()
    renewer = threading.Thread(
        target=_keep_renewed,
        args=(
            engine,
            lease,
            ttl_seconds,
            renew_every_seconds or ttl_seconds / 3,
            sent_at,
            done,
            clock,
        ),
        name=f"renew {key}",
        daemon=True,  # a dying process must not be kept alive by its lock's renewal
    )
    renewer.start()
    try:
        yield lease
    finally:
        done.set()
        renewer.join()
        assert lease.token is not None
        # A lock that passed to another holder stays theirs. A failed release is not the
        # work's failure: the TTL frees the lock.
        try:
            release_lock(engine, key, lease.token)
        except Exception as exc:  # noqa: BLE001
            log.warning("release of lock %s failed (%s); its TTL frees it", key, exc)
