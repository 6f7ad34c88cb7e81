"""A distributed lock with a TTL, kept in PostgreSQL (ADR-0056: no Redis on PIN services).

A lock is a row in pin.distributed_locks. Acquiring never waits: it inserts the row, or
takes it over when the previous holder's TTL has expired. Operators see the holder and
its expiry in that table (`pin locks list`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, text

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


@contextmanager
def held_lock(engine: Engine, key: str, ttl_seconds: float, holder: str) -> Iterator[bool]:
    """Yield whether the lock was acquired; release it on exit if it was."""
    acquired = try_acquire_lock(engine, key, ttl_seconds, holder)
    try:
        yield acquired
    finally:
        if acquired:
            release_lock(engine, key, holder)
