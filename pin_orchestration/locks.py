"""A distributed lock with a TTL, kept in PostgreSQL (ADR-0056: no Redis on PIN services).

A lock is a row in pin.distributed_locks. Acquiring never waits: it inserts the row, or
takes it over when the previous holder's TTL has expired. Operators see the holder and
its expiry in that table (`pin locks list`).

Every job that holds a lock while it works uses `renewed_lock`: a background thread pushes
the expiry out every third of the TTL while the work runs, and the moment a renewal fails
the lease is marked lost and the caller's `on_lost` runs (typically: set the work's stop
event), so the work stops at its next step instead of running on beside a second holder.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine, text

log = logging.getLogger(__name__)

_ACQUIRE = text(
    """
    INSERT INTO pin.distributed_locks AS l (lock_key, holder, acquired_at, expires_at)
    VALUES (:key, :holder, now(), now() + make_interval(secs => :ttl))
    ON CONFLICT (lock_key) DO UPDATE
        SET holder = excluded.holder,
            acquired_at = excluded.acquired_at,
            expires_at = excluded.expires_at
        WHERE l.expires_at <= now()
    RETURNING holder
    """
)
_EXTEND = text(
    """
    UPDATE pin.distributed_locks
    SET expires_at = now() + make_interval(secs => :ttl)
    WHERE lock_key = :key AND holder = :holder AND expires_at > now()
    """
)
_RELEASE = text("DELETE FROM pin.distributed_locks WHERE lock_key = :key AND holder = :holder")
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


def try_acquire_lock(engine: Engine, key: str, ttl_seconds: float, holder: str) -> bool:
    """Take the lock if it is free or expired; never waits. True when `holder` now holds it."""
    with engine.begin() as conn:
        return (
            conn.execute(_ACQUIRE, {"key": key, "holder": holder, "ttl": ttl_seconds}).first()
            is not None
        )


def extend_lock(engine: Engine, key: str, ttl_seconds: float, holder: str) -> bool:
    """Push the expiry out; False when the lock has expired or passed to someone else."""
    with engine.begin() as conn:
        return (
            conn.execute(_EXTEND, {"key": key, "holder": holder, "ttl": ttl_seconds}).rowcount == 1
        )


def release_lock(engine: Engine, key: str, holder: str) -> bool:
    """Release a lock we hold; a lock that passed to another holder is left alone."""
    with engine.begin() as conn:
        return conn.execute(_RELEASE, {"key": key, "holder": holder}).rowcount == 1


def force_release_lock(engine: Engine, key: str) -> bool:
    """Runbook action for a stuck holder: drop the lock whoever holds it."""
    with engine.begin() as conn:
        return conn.execute(_FORCE_RELEASE, {"key": key}).rowcount == 1


def list_locks(engine: Engine) -> list[LockInfo]:
    with engine.connect() as conn:
        return [LockInfo(**row._mapping) for row in conn.execute(_LIST)]


class LockLost(RuntimeError):
    """The lock's renewal failed: another holder may have it now."""


@dataclass
class LockLease:
    """A lock taken by `renewed_lock`. `lost` is set once a renewal fails; from then on
    the holder must not start another step of the work."""

    key: str
    holder: str
    acquired: bool
    lost: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        """Raise LockLost when the lock was lost (call between steps)."""
        if self.lost.is_set():
            raise LockLost(f"lost the lock {self.key} (holder {self.holder}); stopped")


def _keep_renewed(
    engine: Engine,
    lease: LockLease,
    ttl_seconds: float,
    every_seconds: float,
    done: threading.Event,
    on_lost: Callable[[], None] | None,
    clock: Callable[[], float],
) -> None:
    """The renewal thread: extend every `every_seconds` until `done`; on failure mark the
    lease lost, call `on_lost` and end."""
    confirmed_at = clock()
    while not done.wait(every_seconds):
        try:
            renewed = extend_lock(engine, lease.key, ttl_seconds, lease.holder)
            why = "it expired or passed to another holder"
        except Exception as exc:  # noqa: BLE001 — a database hiccup; judged by the TTL below
            renewed = None
            why = f"{type(exc).__name__}: {exc}"
        if renewed:
            confirmed_at = clock()
            continue
        # A transient error is retried while the last confirmed expiry still covers the
        # next attempt; past that we can no longer vouch that nobody else holds the lock.
        if renewed is None and clock() - confirmed_at + every_seconds < ttl_seconds:
            log.warning("renewal of lock %s failed (%s); retrying", lease.key, why)
            continue
        log.error("lock %s lost by %s (%s): stopping the work", lease.key, lease.holder, why)
        lease.lost.set()
        if on_lost is not None:
            on_lost()
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
    `renew_every_seconds` defaults to a third of the TTL, so two renewals may fail on a
    database hiccup before the lock can expire.
    """
    lease = LockLease(key, holder, try_acquire_lock(engine, key, ttl_seconds, holder))
    if not lease.acquired:
        yield lease
        return
    done = threading.Event()
    renewer = threading.Thread(
        target=_keep_renewed,
        args=(engine, lease, ttl_seconds, renew_every_seconds or ttl_seconds / 3, done, on_lost),
        kwargs={"clock": clock},
        name=f"renew {key}",
        daemon=True,  # a dying process must not be kept alive by its lock's renewal
    )
    renewer.start()
    try:
        yield lease
    finally:
        done.set()
        renewer.join()
        release_lock(engine, key, holder)  # a lock that passed to another holder stays theirs
