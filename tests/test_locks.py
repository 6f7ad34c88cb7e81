"""The distributed TTL lock, with real concurrent connections."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import Engine, text

from pin_orchestration.coordination.locks import (
    LockLost,
    extend_lock,
    force_release_lock,
    list_locks,
    release_lock,
    renewed_lock,
    try_acquire_lock,
)

KEY = "Pin:lock:job:scheduled:test"


def test_exactly_one_of_many_concurrent_acquirers_wins(db_engine: Engine) -> None:
    contenders = 8
    barrier = threading.Barrier(contenders)

    def contend(i: int) -> bool:
        with db_engine.connect():  # each thread checks out its own connection first
            pass
        barrier.wait()
        return try_acquire_lock(db_engine, KEY, 60, f"pod-{i}")

    with ThreadPoolExecutor(contenders) as pool:
        tokens = list(pool.map(contend, range(contenders)))
    winners = [i for i, token in enumerate(tokens) if token is not None]
    assert len(winners) == 1
    (lock,) = list_locks(db_engine)
    assert lock.holder == f"pod-{winners[0]}"


def test_acquire_does_not_wait_for_a_holder(db_engine: Engine) -> None:
    assert try_acquire_lock(db_engine, KEY, 60, "a")
    started = time.monotonic()
    assert not try_acquire_lock(db_engine, KEY, 60, "b")
    assert time.monotonic() - started < 5  # answered, not queued behind "a"


def test_lock_expires_after_its_ttl(db_engine: Engine) -> None:
    crashed = try_acquire_lock(db_engine, KEY, 0.3, "crashed-pod")
    assert crashed
    assert not try_acquire_lock(db_engine, KEY, 60, "b")
    deadline = time.monotonic() + 10
    while not try_acquire_lock(db_engine, KEY, 60, "b"):
        assert time.monotonic() < deadline, "the lock never expired"
        time.sleep(0.05)
    assert list_locks(db_engine)[0].holder == "b"
    # The crashed holder's late release does not free b's lock.
    assert not release_lock(db_engine, KEY, crashed)
    assert list_locks(db_engine)[0].holder == "b"


def test_extend_keeps_the_lock_and_fails_once_lost(db_engine: Engine) -> None:
    token = try_acquire_lock(db_engine, KEY, 60, "a")
    assert token
    assert extend_lock(db_engine, KEY, 120, token)
    assert not extend_lock(db_engine, KEY, 120, uuid.uuid4())
    with db_engine.begin() as conn:
        conn.execute(text("UPDATE pin.distributed_locks SET expires_at = now() - interval '1s'"))
    assert not extend_lock(db_engine, KEY, 120, token)


def test_each_acquisition_has_its_own_token(db_engine: Engine) -> None:
    """The same holder string acquiring again (a process's next run) gets a new token: the
    old acquisition's renewal and release no longer touch the lock."""
    first = try_acquire_lock(db_engine, KEY, 0.2, "pod")
    with db_engine.begin() as conn:
        conn.execute(text("UPDATE pin.distributed_locks SET expires_at = now() - interval '1s'"))
    second = try_acquire_lock(db_engine, KEY, 60, "pod")
    assert first and second and first != second
    assert not extend_lock(db_engine, KEY, 60, first)
    assert not release_lock(db_engine, KEY, first)
    assert list_locks(db_engine)[0].holder == "pod"


def test_renewed_lock_releases_on_exit_even_on_error(db_engine: Engine) -> None:
    try:
        with renewed_lock(db_engine, KEY, 60, "a") as lease:
            assert lease.acquired
            with renewed_lock(db_engine, KEY, 60, "b") as second:
                assert not second.acquired
            raise RuntimeError("job failed")
    except RuntimeError:
        pass
    assert list_locks(db_engine) == []


def test_operator_sees_holder_and_can_force_release(db_engine: Engine) -> None:
    assert try_acquire_lock(db_engine, KEY, 60, "host-1:4242:run-9")
    (lock,) = list_locks(db_engine)
    assert (lock.lock_key, lock.holder, lock.expired) == (KEY, "host-1:4242:run-9", False)
    assert lock.expires_at > lock.acquired_at
    assert force_release_lock(db_engine, KEY)
    assert list_locks(db_engine) == []


def test_renewed_lock_outlives_its_ttl_while_the_work_runs(db_engine: Engine) -> None:
    # A renewal must answer within TTL/9: with a 1 s TTL (0.11 s) a machine at a load
    # average of 38 marked the lock lost, as designed; 6 s leaves it 0.67 s.
    ttl = 6.0
    with renewed_lock(db_engine, KEY, ttl, "worker") as lease:
        assert lease.acquired
        (lock,) = list_locks(db_engine)
        first_expiry = lock.expires_at
        # The gate is the database's clock passing the expiry the lock was taken with:
        # without renewal it would have expired there, and an intruder would win. The
        # bound only ends a broken run.
        bound = time.monotonic() + 120
        while True:
            assert not try_acquire_lock(db_engine, KEY, 60, "intruder")
            with db_engine.connect() as conn:
                now = conn.execute(text("SELECT now()")).scalar_one()
            if now > first_expiry:
                break
            assert time.monotonic() < bound, "the database's clock did not pass the TTL"
            time.sleep(0.1)
        assert not try_acquire_lock(db_engine, KEY, 60, "intruder")
        assert not lease.lost.is_set()
        lease.check()
        (lock,) = list_locks(db_engine)
        assert lock.holder == "worker" and not lock.expired
        assert lock.expires_at > first_expiry
    assert list_locks(db_engine) == []


def test_renewed_lock_not_acquired_runs_no_renewal(db_engine: Engine) -> None:
    assert try_acquire_lock(db_engine, KEY, 60, "other")
    with renewed_lock(db_engine, KEY, 60, "late") as lease:
        assert not lease.acquired
    assert list_locks(db_engine)[0].holder == "other"  # not released by the loser


def test_failed_renewal_marks_the_lease_lost_and_stops_the_work(db_engine: Engine) -> None:
    stop = threading.Event()
    with renewed_lock(db_engine, KEY, 1.0, "worker", on_lost=stop.set) as lease:
        assert lease.acquired
        # An operator force-releases the lock and another process takes it.
        assert force_release_lock(db_engine, KEY)
        assert try_acquire_lock(db_engine, KEY, 60, "thief")
        # The next renewal (within a third of the TTL) fails and says so at once.
        assert stop.wait(2.0), "the work was not told to stop"
        assert lease.lost.is_set()
        with pytest.raises(LockLost, match=KEY):
            lease.check()
    assert list_locks(db_engine)[0].holder == "thief"  # the thief's lock is left alone
