"""The drain against other drains and against raisers, on separate connections of the real
PostgreSQL: the claim, the lease, re-raises during a recalc, retries of a failed row."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine, event, text

from pin_orchestration.chessboard import drain as drain_module
from pin_orchestration.chessboard.drain import (
    POISON_ALERT,
    ProjectOutcome,
    claim_next_due,
    drain_loop,
    drain_tick,
    finish_claim,
    process_next_due,
)
from pin_orchestration.chessboard.metrics import record_heartbeat
from pin_orchestration.chessboard.queue import RecalcPolicy, request_project_recalc
from pin_orchestration.chessboard.recalc import find_divergence
from tests.chessboard.world import (
    T0,
    add_layout,
    add_layout_group,
    add_object,
    add_project,
    enqueue,
    outbox,
    queue_row,
    row,
)

DUE = T0 + timedelta(seconds=31)
GATE = 4242


def db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def install_gate(engine: Engine, table: str) -> None:
    """Updates of `table` wait while the test holds advisory lock GATE: a drain can be
    paused inside its recalc, at a known point, holding the locks it took so far."""
    with engine.begin() as conn:
        conn.execute(
            text(f"""
            CREATE FUNCTION public.test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_advisory_lock_shared({GATE});
                PERFORM pg_advisory_unlock_shared({GATE});
                RETURN NEW;
            END $$
        """)
        )
        conn.execute(
            text(
                f"CREATE TRIGGER gate BEFORE UPDATE ON chessboard.{table} "
                "FOR EACH ROW EXECUTE FUNCTION public.test_gate()"
            )
        )


@contextmanager
def gate_closed(engine: Engine) -> Iterator[None]:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": GATE})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": GATE})
            conn.commit()


def wait_until_blocked(engine: Engine, wait_event: str, count: int = 1) -> None:
    """Until `count` other sessions wait on a heavyweight lock of kind `wait_event`
    ('advisory', 'transactionid', …): the condition the test proceeds on, not a delay."""
    deadline = time.monotonic() + 15
    with engine.connect() as conn:
        while True:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND wait_event = :e"
                ),
                {"e": wait_event},
            ).scalar_one()
            conn.rollback()
            if waiting >= count:
                return
            assert time.monotonic() < deadline, f"nobody waits on a {wait_event} lock"
            time.sleep(0.01)


class Worker(threading.Thread):
    """Runs `work` on its own thread (and connection); an exception is kept, never lost."""

    def __init__(self, work: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:
            self.error = exc

    def outcome(self, timeout: float = 30) -> object:
        self.join(timeout)
        assert not self.is_alive(), "the worker is still blocked"
        if self.error is not None:
            raise self.error
        return self.result


def stale_project(engine: Engine) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """A project whose stored counters are stale (the recalc updates the project, its
    layout and its group); returns (project, layout group, layout)."""
    with engine.begin() as conn:
        p = add_project(conn, property_objects_total_count=9)
        g = add_layout_group(conn, p)
        lay = add_layout(conn, p, g, "40")
        add_object(conn, p, status="Free", price="10", layout_id=lay)
    return p, g, lay


def test_two_workers_on_one_due_row_recalculate_it_once(db_engine: Engine) -> None:
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)

    # Another worker is mid-claim on the row: a claim skips it at once, it does not queue.
    with db_engine.connect() as other:
        other.execute(
            text("SELECT 1 FROM chessboard.project_recalc_requests FOR UPDATE"),
        )
        skipping = Worker(lambda: process_next_due(db_engine, now=DUE))
        skipping.start()
        assert skipping.outcome(timeout=3) is None
        other.rollback()

    # A worker is inside the project's recalc; a second one takes nothing and returns.
    install_gate(db_engine, "projects")
    with gate_closed(db_engine):
        first = Worker(lambda: process_next_due(db_engine, now=DUE))
        first.start()
        wait_until_blocked(db_engine, "advisory")
        second = Worker(lambda: process_next_due(db_engine, now=DUE))
        second.start()
        assert second.outcome(timeout=3) is None
    done = first.outcome()

    assert isinstance(done, ProjectOutcome) and done.result == "recalculated"
    with db_engine.connect() as conn:
        assert [(e["entity"], e["version"]) for e in outbox(conn) if e["entity"] == "project"] == [
            ("project", 2)
        ]
        assert row(conn, "projects", p)["version"] == 2
        assert queue_row(conn, p) is None


def test_request_during_recalc_does_not_wait_and_gets_one_more_recalc(db_engine: Engine) -> None:
    p, _, lay = stale_project(db_engine)
    enqueue(db_engine, p, at=db_now(db_engine) - timedelta(minutes=1))
    install_gate(db_engine, "layout_groups")  # the drain pauses after updating layouts
    timings: list[float] = []
    raised = threading.Event()

    def raise_then_edit() -> None:
        with db_engine.connect() as raiser:
            started = time.perf_counter()
            request_project_recalc(raiser, p, p, "LayoutChanged")
            timings.append(time.perf_counter() - started)
            raised.set()
            # Its own edit of a layout the drain holds waits for the recalc's commit: the
            # mutation's lock, not the request.
            raiser.execute(
                text("UPDATE chessboard.layouts SET total_area = 55 WHERE id = :l"), {"l": lay}
            )
            raiser.commit()

    with gate_closed(db_engine):
        drain = Worker(lambda: process_next_due(db_engine))
        drain.start()
        wait_until_blocked(db_engine, "advisory")
        raiser = Worker(raise_then_edit)
        raiser.start()
        # The request returns while the drain is still paused inside the recalc.
        assert raised.wait(5), "the raiser waits for the running recalc"
        wait_until_blocked(db_engine, "transactionid")
    raiser.outcome()
    outcome = drain.outcome()

    assert timings[0] < 0.2
    assert isinstance(outcome, ProjectOutcome) and outcome.result == "recalculated"
    assert outcome.requeued
    assert_one_more_recalc_covers_the_raise(db_engine, p, edit_committed_after_the_recalc=True)


def assert_one_more_recalc_covers_the_raise(
    engine: Engine, project_id: uuid.UUID, *, edit_committed_after_the_recalc: bool
) -> None:
    """The request raised during the recalc stayed queued, as one request due a debounce
    later, and its recalc brings the stored aggregates to the raiser's data."""
    with engine.connect() as conn:
        request = queue_row(conn, project_id)
        assert request is not None, "the request raised during the recalc was lost"
        assert request["requested_count"] == 1 and request["attempt_count"] == 0
        assert request["claim_token"] is None and request["claimed_until"] is None
        assert (find_divergence(conn, project_id) != []) == edit_committed_after_the_recalc
    again = process_next_due(engine, now=request["due_at"])
    assert again is not None and again.result == "recalculated"
    with engine.connect() as conn:
        assert queue_row(conn, project_id) is None
        assert find_divergence(conn, project_id) == []


def test_a_killed_drain_leaves_a_lease_another_drain_takes_when_it_expires(
    db_engine: Engine,
) -> None:
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)
    policy = RecalcPolicy(claim_lease_seconds=60)
    killed = claim_next_due(db_engine, now=DUE, policy=policy)  # …and never finished
    assert killed is not None and killed.project_id == p

    assert process_next_due(db_engine, now=DUE + timedelta(seconds=59), policy=policy) is None
    taken = process_next_due(db_engine, now=DUE + timedelta(seconds=61), policy=policy)

    assert taken is not None and taken.result == "recalculated"
    with db_engine.connect() as conn:
        assert queue_row(conn, p) is None
    # The killed drain's late finish (a zombie) must not drop a newer request.
    enqueue(db_engine, p, at=DUE + timedelta(minutes=1))
    assert not finish_claim(db_engine, killed)
    with db_engine.connect() as conn:
        assert queue_row(conn, p) is not None


def test_two_workers_retry_a_failing_row_no_sooner_than_a_tick_apart(
    db_engine: Engine, failing_project
) -> None:
    with db_engine.begin() as conn:
        bad = failing_project(conn)
    enqueue(db_engine, bad, at=db_now(db_engine) - timedelta(minutes=1))
    tick = 0.4
    policy = RecalcPolicy(tick_seconds=tick, floor_seconds=0.01, poison_threshold=5)
    stop = threading.Event()
    failures: list[tuple[float, int, str]] = []
    lock = threading.Lock()

    def record(worker: str) -> Callable[[ProjectOutcome], None]:
        def on_outcome(o: ProjectOutcome) -> None:
            with lock:
                failures.append((time.monotonic(), o.attempt_count, worker))
            if o.poisoned:
                stop.set()

        return on_outcome

    workers = [
        Worker(
            lambda name=name: drain_loop(
                db_engine,
                stop,
                policy=policy,
                deadline=time.monotonic() + 20,
                on_outcome=record(name),
            )
        )
        for name in ("a", "b")
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.outcome()

    assert [attempt for _, attempt, _ in failures] == [1, 2, 3, 4, 5]
    gaps = [b[0] - a[0] for a, b in zip(failures, failures[1:], strict=False)]
    assert min(gaps) >= 0.9 * tick, gaps
    assert failures[-1][0] - failures[0][0] >= 4 * 0.9 * tick
    with db_engine.connect() as conn:
        request = queue_row(conn, bad)
    assert request["attempt_count"] == 5


def _stall_after_recalc(
    monkeypatch: pytest.MonkeyPatch, stalled: threading.Event, release: threading.Event
) -> Callable[..., object]:
    """The drain's recalc goes quiet after its statements, transaction open, until released."""
    real_recalc = drain_module.recalc_project

    def recalc_then_stall(conn: Connection, project_id: uuid.UUID, tenant_id: uuid.UUID):
        result = real_recalc(conn, project_id, tenant_id)
        stalled.set()
        release.wait(60)
        return result

    monkeypatch.setattr(drain_module, "recalc_project", recalc_then_stall)
    return real_recalc


def test_a_drain_stalled_inside_its_recalc_lets_another_drain_recalculate_the_project(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain whose client stops mid-recalc (a hung network: its next statement never
    reaches PostgreSQL) holds the project's rows and its queue row only DRAIN_IDLE_SECONDS:
    the server ends its transaction, and another drain, past the lease, recalculates the
    project. (The fault suite's recalc-pg-hang: a drain behind a blackholed proxy held them
    for the whole hang, and the requests due at it were not drained.)"""
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)
    policy = RecalcPolicy(claim_lease_seconds=1)
    stalled, release = threading.Event(), threading.Event()
    real_recalc = _stall_after_recalc(monkeypatch, stalled, release)
    first = Worker(lambda: process_next_due(db_engine, now=DUE, policy=policy))
    first.start()
    try:
        assert stalled.wait(30), "the first drain never reached its recalc"
        monkeypatch.setattr(drain_module, "recalc_project", real_recalc)
        taken, later = None, DUE
        deadline = time.monotonic() + 30
        while taken is None:
            assert time.monotonic() < deadline, "the stalled drain still holds the project"
            later += timedelta(minutes=1)  # past its lease and any retry delay
            taken = process_next_due(db_engine, now=later, policy=policy)
            if taken is None:
                time.sleep(0.2)
    finally:
        release.set()
        first.join(30)
    assert isinstance(taken, ProjectOutcome) and taken.project_id == p
    assert taken.result == "recalculated"
    with db_engine.connect() as conn:
        assert queue_row(conn, p) is None
        assert row(conn, "projects", p)["version"] == 2  # the stalled recalc rolled back


def wait_until_no_transaction_idles(engine: Engine) -> None:
    """Until PostgreSQL has ended every session idling in a transaction on this database."""
    deadline = time.monotonic() + 60
    with engine.connect() as conn:
        while conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state = 'idle in transaction'"
            )
        ).scalar_one():
            assert time.monotonic() < deadline, "a transaction idled past its limit"
            conn.rollback()
            time.sleep(0.2)


def test_a_drain_ended_for_stalling_counts_no_attempt_and_raises_no_alert(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ended a stalled drain's recalc (idle past its limit): the drain stalled,
    the project did not fail. No attempt is counted (five stalls would poison a healthy
    project), and at the poison threshold's edge no alert is raised."""
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE chessboard.project_recalc_requests SET attempt_count = 4 "
                "WHERE project_id = :p"
            ),
            {"p": p},
        )
    stalled, release = threading.Event(), threading.Event()
    real_recalc = _stall_after_recalc(monkeypatch, stalled, release)
    policy = RecalcPolicy(claim_lease_seconds=1)
    first = Worker(lambda: process_next_due(db_engine, now=DUE, policy=policy))
    first.start()
    assert stalled.wait(30)
    wait_until_no_transaction_idles(db_engine)
    monkeypatch.setattr(drain_module, "recalc_project", real_recalc)
    with caplog.at_level(logging.INFO):
        release.set()
        outcome = first.outcome()
    # Deferred like a conflict (retried conflict_retry_seconds later), no attempt counted.
    assert outcome is None
    assert "project_recalc_deferred" in caplog.text
    assert POISON_ALERT not in caplog.text and "project_recalc_failed" not in caplog.text
    with db_engine.connect() as conn:
        assert queue_row(conn, p)["attempt_count"] == 4
    again = process_next_due(db_engine, now=DUE + timedelta(minutes=1), policy=policy)
    assert isinstance(again, ProjectOutcome) and again.result == "recalculated"
    with db_engine.connect() as conn:
        assert queue_row(conn, p) is None


def test_a_stalled_drain_whose_row_another_drain_finished_raises_no_alert(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A drain's failure after its lease passed to another drain (which recalculated and
    finished the row) is not the project's: no attempt and no poison alert."""
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)
    policy = RecalcPolicy(claim_lease_seconds=1, poison_threshold=1)
    claim = claim_next_due(db_engine, now=DUE, policy=policy)
    assert claim is not None
    taken = process_next_due(db_engine, now=DUE + timedelta(minutes=1), policy=policy)
    assert isinstance(taken, ProjectOutcome) and taken.result == "recalculated"
    with caplog.at_level(logging.ERROR):
        late = drain_module._record_failure(
            db_engine, claim, RuntimeError("late"), time.perf_counter(), policy, DUE
        )
    assert not late.poisoned and late.attempt_count == claim.attempt_count
    assert POISON_ALERT not in caplog.text


class _CommitHangs:
    """The COMMIT of `thread`'s transaction never reaches PostgreSQL until released (a
    network blackholed between a transaction's last statement and its COMMIT)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.thread: threading.Thread | None = None
        self.hung, self.release = threading.Event(), threading.Event()
        event.listen(engine, "commit", self._on_commit)

    def _on_commit(self, conn: object) -> None:
        if threading.current_thread() is self.thread and not self.release.is_set():
            self.hung.set()
            self.release.wait(90)

    def remove(self) -> None:
        self.release.set()
        event.remove(self.engine, "commit", self._on_commit)


def test_a_drain_hung_before_its_heartbeat_commit_does_not_stall_the_other_drains(
    db_engine: Engine,
) -> None:
    """Every drain adds to the shared metrics rows: one hung with them locked must not stop
    the others' ticks for longer than the idle limit."""
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)
    hang = _CommitHangs(db_engine)
    try:
        hung = Worker(lambda: record_heartbeat(db_engine))
        hang.thread = hung
        hung.start()
        assert hang.hung.wait(30)
        other = Worker(lambda: drain_tick(db_engine, now=DUE))
        other.start()
        tick = other.outcome(timeout=60)
    finally:
        hang.remove()
    assert [o.project_id for o in tick.outcomes] == [p]  # type: ignore[attr-defined]


def test_a_drain_hung_before_its_claim_commit_does_not_block_a_raiser(db_engine: Engine) -> None:
    """A raiser never waits for a drain beyond a few statements: not for one whose claim's
    COMMIT is lost in a hung network either (the claim's row lock ends with its idle limit)."""
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)
    hang = _CommitHangs(db_engine)
    try:
        hung = Worker(lambda: claim_next_due(db_engine, now=DUE))
        hang.thread = hung
        hung.start()
        assert hang.hung.wait(30)

        def raise_again() -> None:
            with db_engine.begin() as conn:
                tenant = row(conn, "projects", p)["tenant_id"]
                request_project_recalc(conn, p, tenant, "Crud", now=DUE)

        raiser = Worker(raise_again)
        raiser.start()
        raiser.outcome(timeout=60)
    finally:
        hang.remove()


def test_a_healthy_drain_with_a_short_lease_is_not_ended_between_its_statements(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease shorter than a pause between the recalc's statements (Python work, a starved
    CPU) must not end a live recalc: the idle limit never goes under MIN_IDLE_SECONDS."""
    p, _, _ = stale_project(db_engine)
    enqueue(db_engine, p)
    real_recalc = drain_module.recalc_project

    def recalc_then_pause(conn: Connection, project_id: uuid.UUID, tenant_id: uuid.UUID):
        result = real_recalc(conn, project_id, tenant_id)
        time.sleep(0.05)  # the client's own pause before the next statement
        return result

    monkeypatch.setattr(drain_module, "recalc_project", recalc_then_pause)
    outcome = process_next_due(db_engine, now=DUE, policy=RecalcPolicy(claim_lease_seconds=0.01))
    assert isinstance(outcome, ProjectOutcome) and outcome.result == "recalculated"
