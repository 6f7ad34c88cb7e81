"""The drain loop wakes when the next row falls due, not on a blind tick — against the real
PostgreSQL, with an injected clock (fake sleeps) except where a real stop must cut a sleep."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from pin_orchestration.chessboard.drain import (
    LoopResult,
    drain_loop,
    seconds_until_next_due,
    wake_delay,
)
from pin_orchestration.chessboard.queue import RecalcConfigError, RecalcPolicy
from tests.chessboard.world import T0, add_object, add_project, enqueue, queue_row

WAKE = RecalcPolicy(tick_seconds=5.0, floor_seconds=0.05)


class FakeClock:
    """Monotonic seconds since T0 for the loop, T0 + those seconds as the database's now(),
    and a sleep that only advances time (recording how long the loop asked to sleep)."""

    def __init__(self, at: float = 0.0) -> None:
        self.t = at
        self.sleeps: list[float] = []
        self.stop = threading.Event()

    def monotonic(self) -> float:
        return self.t

    def db_now(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def wait(self, seconds: float) -> bool:
        self.sleeps.append(round(seconds, 3))
        self.t += seconds
        return self.stop.is_set()

    def run(self, engine: Engine, policy: RecalcPolicy = WAKE, **kwargs) -> LoopResult:
        return drain_loop(
            engine,
            self.stop,
            policy=policy,
            clock=self.monotonic,
            db_now=self.db_now,
            wait=self.wait,
            **kwargs,
        )


def project(engine: Engine) -> uuid.UUID:
    with engine.begin() as conn:
        p = add_project(conn)
        add_object(conn, p, status="Free", price="1")
    return p


@pytest.mark.parametrize(
    ("until_due", "expected"),
    [(None, 5.0), (20.0, 5.0), (1.5, 1.5), (0.01, 0.05), (-3.0, 0.05)],
)
def test_wake_delay_is_until_due_within_floor_and_tick(
    until_due: float | None, expected: float
) -> None:
    assert wake_delay(until_due, WAKE) == expected


def test_wake_bounds_are_validated() -> None:
    with pytest.raises(RecalcConfigError, match="floor_seconds must be > 0"):
        RecalcPolicy(tick_seconds=1, floor_seconds=0).validate()
    with pytest.raises(RecalcConfigError, match="floor_seconds must be <= tick_seconds"):
        RecalcPolicy(tick_seconds=1, floor_seconds=2).validate()


def test_seconds_until_next_due_leaves_out_poison_and_backing_off_rows(db_engine: Engine) -> None:
    poison, later, backing_off = project(db_engine), project(db_engine), project(db_engine)
    enqueue(db_engine, poison, at=T0 - timedelta(minutes=5))
    enqueue(db_engine, backing_off, at=T0 - timedelta(minutes=1))
    enqueue(db_engine, later, at=T0)  # due at T0 + 30 s
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE chessboard.project_recalc_requests SET attempt_count = 5 "
                "WHERE project_id = :p"
            ),
            {"p": poison},
        )
        assert seconds_until_next_due(conn, now=T0) == -30.0  # `backing_off` is overdue
        # A failed row's not-before counts, not its (unchanged) due_at.
        conn.execute(
            text(
                "UPDATE chessboard.project_recalc_requests "
                "SET not_before = CAST(:t AS timestamptz) + interval '40 seconds' "
                "WHERE project_id = :p"
            ),
            {"p": backing_off, "t": T0},
        )
        assert seconds_until_next_due(conn, now=T0) == 30.0
        conn.execute(
            text("DELETE FROM chessboard.project_recalc_requests WHERE project_id <> :p"),
            {"p": poison},
        )
        assert seconds_until_next_due(conn, now=T0) is None


def test_loop_wakes_when_the_next_row_falls_due(db_engine: Engine) -> None:
    a, b = project(db_engine), project(db_engine)
    enqueue(db_engine, a, at=T0)  # due T0 + 30 s
    enqueue(db_engine, b, at=T0 + timedelta(seconds=30))  # due T0 + 60 s
    clock = FakeClock(at=28.5)
    taken_at: dict[uuid.UUID, float] = {}

    result = clock.run(
        db_engine,
        exit_when_idle=True,
        on_outcome=lambda o: taken_at.setdefault(o.project_id, clock.t),
    )

    # 1.5 s straight to a's due time (not the 5 s tick); then b is 30 s off, so the sleep
    # is capped at the tick — a request queued meanwhile would be seen within 5 s.
    assert clock.sleeps == [1.5, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]
    assert taken_at == {a: 30.0, b: 60.0}
    assert [o.result for o in result.outcomes] == ["recalculated", "recalculated"]
    assert result.ended == "idle"  # nothing queued any more


def test_a_full_batch_goes_straight_on(db_engine: Engine) -> None:
    projects = [project(db_engine) for _ in range(3)]
    for p in projects:
        enqueue(db_engine, p, at=T0)
    clock = FakeClock(at=31)

    result = clock.run(db_engine, policy=RecalcPolicy(batch_size=2), exit_when_idle=True)

    assert len(result.outcomes) == 3 and result.passes == 2
    assert clock.sleeps == []


def test_poison_rows_do_not_wake_the_loop(db_engine: Engine) -> None:
    p = project(db_engine)
    enqueue(db_engine, p, at=T0)
    with db_engine.begin() as conn:
        conn.execute(text("UPDATE chessboard.project_recalc_requests SET attempt_count = 5"))

    idle = FakeClock(at=60).run(db_engine, exit_when_idle=True)
    assert (idle.ended, idle.outcomes) == ("idle", [])

    clock = FakeClock(at=60)
    bounded = clock.run(db_engine, deadline=72)
    assert clock.sleeps == [5.0, 5.0, 2.0]  # tick, tick, the rest up to the deadline
    assert (bounded.ended, bounded.outcomes) == ("deadline", [])


def test_a_failed_row_is_retried_a_tick_later_not_in_a_tight_loop(
    db_engine: Engine, failing_project
) -> None:
    with db_engine.begin() as conn:
        bad = failing_project(conn)
    enqueue(db_engine, bad, at=T0)
    clock = FakeClock(at=31)

    result = clock.run(db_engine, deadline=43)

    assert [o.result for o in result.outcomes] == ["failed"] * 3  # at 31, 36, 41
    assert clock.sleeps == [5.0, 5.0, 2.0]
    assert result.ended == "deadline"
    with db_engine.connect() as conn:
        assert queue_row(conn, bad)["attempt_count"] == 3


def test_next_due_after_the_deadline_ends_an_idle_run(db_engine: Engine) -> None:
    p = project(db_engine)
    enqueue(db_engine, p, at=T0)  # due T0 + 30 s
    clock = FakeClock(at=0)

    result = clock.run(db_engine, deadline=20, exit_when_idle=True)

    assert (result.ended, clock.sleeps) == ("idle", [])


def test_stop_cuts_the_sleep_short(db_engine: Engine) -> None:
    stop = threading.Event()
    asleep = threading.Event()
    results: list[LoopResult] = []

    def wait(seconds: float) -> bool:
        asleep.set()
        return stop.wait(seconds)

    worker = threading.Thread(
        target=lambda: results.append(
            drain_loop(db_engine, stop, policy=RecalcPolicy(tick_seconds=3600), wait=wait)
        )
    )
    worker.start()
    assert asleep.wait(10), "the loop never went to sleep"
    stop.set()
    worker.join(10)

    assert not worker.is_alive(), "stop did not end an hour-long sleep"
    assert results[0].ended == "stopped"
