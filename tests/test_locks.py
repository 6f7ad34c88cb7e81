"""The distributed TTL lock, with real concurrent connections."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

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
    """b's attempt answers while a holds the lock (for an hour, and a never lets it go):
    an attempt queued behind the holder would not answer at all. The join's bound only
    ends that broken run; how fast the answer comes is the machine's matter."""
    assert try_acquire_lock(db_engine, KEY, 3600, "a")
    answers: list[uuid.UUID | None] = []
    attempt = threading.Thread(
        target=lambda: answers.append(try_acquire_lock(db_engine, KEY, 60, "b")), daemon=True
    )
    attempt.start()
    attempt.join(120)
    assert not attempt.is_alive(), "b's attempt waited for the holder"
    assert answers == [None]
    (lock,) = list_locks(db_engine)
    assert lock.holder == "a" and not lock.expired


def test_lock_expires_after_its_ttl(db_engine: Engine) -> None:
    """A holder that crashed keeps its lock for its TTL, and not past it. Told by the
    database's clock, the only one the lock knows: b tries from the start, however late a
    starved test makes its attempts, and its takeover is stamped after the TTL's end."""
    crashed = try_acquire_lock(db_engine, KEY, 1.0, "crashed-pod")
    assert crashed
    (held,) = list_locks(db_engine)
    assert held.expires_at - held.acquired_at == timedelta(seconds=1)
    bound = time.monotonic() + 60  # a bound for a broken run only
    while not try_acquire_lock(db_engine, KEY, 60, "b"):
        assert time.monotonic() < bound, "the lock never expired"
        time.sleep(0.05)
    (lock,) = list_locks(db_engine)
    assert lock.holder == "b"
    assert lock.acquired_at >= held.expires_at, "taken over before the TTL had run out"
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
    # average of 38 marked the lock lost, as designed, and a starved one did at 6 s. The
    # lease's clock is the test's and stands still: a renewal answered late is tried
    # again, never judged lost; what is checked is the lock in the database, which only
    # renewals that land keep from the intruder. Renewals come every second.
    ttl = 6.0
    with renewed_lock(
        db_engine, KEY, ttl, "worker", renew_every_seconds=1.0, clock=lambda: 0.0
    ) as lease:
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
    # A TTL no starved test runs out, renewals every 0.3 s, and the lease's clock the
    # test's (standing still): a renewal answered late is tried again, so only the
    # renewal that finds the thief's lock can mark the lease lost.
    stop = threading.Event()
    with renewed_lock(
        db_engine,
        KEY,
        60,
        "worker",
        on_lost=stop.set,
        renew_every_seconds=0.3,
        clock=lambda: 0.0,
    ) as lease:
        assert lease.acquired
        # An operator force-releases the lock and another process takes it.
        assert force_release_lock(db_engine, KEY)
        assert try_acquire_lock(db_engine, KEY, 60, "thief")
        # The next renewal fails and says so at once (the bound ends a broken run only).
        assert stop.wait(60), "the work was not told to stop"
        assert lease.lost.is_set()
        with pytest.raises(LockLost, match=KEY):
            lease.check()
    assert list_locks(db_engine)[0].holder == "thief"  # the thief's lock is left alone


def test_a_fenced_write_hung_before_its_commit_does_not_hold_the_lock_past_its_ttl(
    db_url: str, db_engine: Engine
) -> None:
    """Holder A's connection goes silent between its fence and its COMMIT (the fault
    suite's recalc-pg-hang: the server blackholed at that moment). The fence's key-share
    lock on the lock row would keep every takeover out for as long as the hang lasts; the
    server ends A's idle transaction after the TTL instead, and B takes the lock over
    while A is still hung."""
    from faults.postgres import database_url_via, proxy_in_front_of
    from pin_orchestration.coordination.locks import take_fence
    from pin_orchestration.platform.db import create_db_engine

    ttl = 2.0
    threads_before = {thread.ident for thread in threading.enumerate()}
    fenced = threading.Event()  # A holds the fence, its transaction open
    commit = threading.Event()  # the proxy hangs: A may send its COMMIT now
    a_errors: list[BaseException] = []
    proxy = proxy_in_front_of(db_url)
    # A renewal that connects while the proxy hangs waits out its connect_timeout (10 s by
    # default) even after the hang ends: its connection was never forwarded.
    url_a = make_url(database_url_via(db_url, proxy)).update_query_dict({"connect_timeout": "2"})
    engine_a = create_db_engine(url_a.render_as_string(hide_password=False))

    def holder_a() -> None:
        try:
            with renewed_lock(engine_a, KEY, ttl, "a") as lease:
                assert lease.acquired
                with engine_a.begin() as conn:
                    take_fence(conn, lease)
                    # The proxy hangs at once, by A's own hand: however long a starved
                    # test takes to look, A's COMMIT leaves into the hang (the server
                    # may end the idle session first: the COMMIT fails all the same).
                    proxy.set_mode("hang")
                    fenced.set()
                    commit.wait()
                # The COMMIT leaves when the proxy hangs and gets through once it passes
                # again: by then the server has ended A's session, so it fails.
        except BaseException as exc:  # noqa: BLE001 — judged by the test
            a_errors.append(exc)
        finally:
            fenced.set()  # a failed acquisition or fence must not leave the test waiting

    a = threading.Thread(target=holder_a, name="holder a")
    a.start()
    try:
        assert fenced.wait(120), "A took no fence"
        assert not a_errors, a_errors
        assert proxy.mode == "hang"
        commit.set()
        # B (not behind the proxy) takes the lock over once the TTL has passed. Each
        # attempt that meets A's fence waits its lock_timeout (1 s) and gets None; the bound
        # only ends a broken run.
        deadline = time.monotonic() + ttl + 30
        while (b_token := try_acquire_lock(db_engine, KEY, 60, "b")) is None:
            assert time.monotonic() < deadline, (
                "B could not take the lock over while A's fenced transaction was hung"
            )
            time.sleep(0.05)
        # Taken over while A was still hung: not its COMMIT ending the transaction.
        assert proxy.mode == "hang" and a.is_alive()
        assert list_locks(db_engine)[0].holder == "b"
    finally:
        proxy.set_mode("pass")  # A's held COMMIT goes on to the server, and its renewals
        a.join(60)
        for thread in threading.enumerate():  # A's renewal attempts (daemons) end too
            if thread.ident not in threads_before and thread.name.startswith("renew "):
                thread.join(30)
        # A's pool closes its connections before the proxy goes, so each one's end passes
        # through to the server: a proxy's close() leaves a pipe reading a live server
        # connection blocked (closing a socket does not wake a recv() waiting on it).
        engine_a.dispose()
        proxy.close()
    assert not a.is_alive()
    # The server ended A's idle session (25P03, idle_in_transaction_session_timeout), so
    # its COMMIT failed: nothing A wrote under the fence outlived its TTL.
    assert len(a_errors) == 1 and isinstance(a_errors[0], DBAPIError), a_errors
    assert getattr(a_errors[0].orig, "sqlstate", None) == "25P03", a_errors
    assert list_locks(db_engine)[0].holder == "b"
    assert release_lock(db_engine, KEY, b_token)
    # Nothing the test started is left: A, its renewals, the proxy's threads.
    bound = time.monotonic() + 30
    started = [thread for thread in threading.enumerate() if thread.ident not in threads_before]
    for thread in started:
        thread.join(max(bound - time.monotonic(), 0))
    assert not [thread for thread in started if thread.is_alive()]
