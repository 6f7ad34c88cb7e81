"""news-snapshot-detach-retry against the real PostgreSQL and a real HTTP server on loopback:
the seed's test table (DET-8) and the guarantees behind it (DET-1…DET-7)."""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pytest_httpserver import HTTPServer
from sqlalchemy import Engine, event, text
from werkzeug import Request, Response

from pin_orchestration.coordination.jobruns import RunStatus
from pin_orchestration.coordination.locks import list_locks, try_acquire_lock
from pin_orchestration.news.selections import CallKind, CallResult, SelectionsClient
from pin_orchestration.news.snapshot_detach.outbox import (
    RequeueError,
    autocommit,
    claim_batch,
    claim_due,
    enqueue_snapshot_detach,
    query,
    record_outcomes,
    requeue_quarantined,
)
from pin_orchestration.news.snapshot_detach.policy import (
    DETACH_JOB,
    DetachOptions,
    Reason,
    SnapshotDetachConfigError,
    backoff_seconds,
    decide,
)
from pin_orchestration.news.snapshot_detach.worker import QUEUED_ROUNDS, drain, run_detach_retry
from tests.log_gates import LogSeen, watching_log

TOKEN = "m2m-test-token"
NO_JITTER = DetachOptions(backoff_jitter_ratio=0.0)
DETACH_PATH = "/internal/snapshots/<id>/detach"


def zero() -> float:
    return 0.0


class Selections:
    """A selections stand-in on 127.0.0.1: records calls, answers as told per snapshot."""

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.calls: list[tuple[str, dict, str | None]] = []
        self.status = 200
        self.hang: threading.Event | None = None
        self.on_call: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        server.expect_request(_detach_path_matcher(), method="POST").respond_with_handler(
            self._handle
        )

    @property
    def url(self) -> str:
        return self.server.url_for("").rstrip("/")

    def _handle(self, request: Request) -> Response:
        snapshot_id = request.path.split("/")[3]
        with self._lock:
            self.calls.append(
                (snapshot_id, json.loads(request.data), request.headers.get("Authorization"))
            )
        if self.on_call is not None:
            self.on_call(snapshot_id)
        if self.hang is not None:
            self.hang.wait(10)
        return Response(
            json.dumps({"status": "Detached"}), self.status, mimetype="application/json"
        )

    def called(self) -> Counter[str]:
        with self._lock:
            return Counter(c[0] for c in self.calls)


def _detach_path_matcher():
    import re

    return re.compile(r"^/internal/snapshots/[0-9a-f-]{36}/detach$")


@pytest.fixture
def selections() -> Iterator[Selections]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    stand_in = Selections(server)
    try:
        yield stand_in
    finally:
        if stand_in.hang is not None:
            stand_in.hang.set()
        server.clear()
        server.stop()


def client(selections: Selections, timeout: float = 5.0, pool: int = 8) -> SelectionsClient:
    return SelectionsClient(selections.url, TOKEN, timeout_seconds=timeout, pool_size=pool)


def enqueue(engine: Engine, n: int = 1, reason: Reason = Reason.BLOCK_REPLACED) -> list[uuid.UUID]:
    snapshots = [uuid.uuid4() for _ in range(n)]
    post = uuid.uuid4()
    with engine.begin() as conn:
        for snapshot in snapshots:
            enqueue_snapshot_detach(conn, snapshot, post, reason)
    return snapshots


def row(engine: Engine, snapshot_id: uuid.UUID):
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT * FROM news.snapshot_detach_outbox WHERE snapshot_id = :s "
                "ORDER BY created_at"
            ),
            {"s": snapshot_id},
        ).one()


def statuses(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(
            conn.execute(text("SELECT status FROM news.snapshot_detach_outbox")).scalars()
        )


def run(
    engine: Engine,
    selections: Selections,
    options: DetachOptions = NO_JITTER,
    timeout: float = 5.0,
    **kwargs,
):
    kwargs.setdefault("rand", zero)
    with client(selections, timeout=timeout) as c:
        return run_detach_retry(engine, c, options, run_id="test-run", holder="test", **kwargs)


def elapse(engine: Engine, seconds: float) -> None:
    """As if `seconds` passed on the database's clock (the one detach reads): every row's
    next attempt moves that much closer."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE news.snapshot_detach_outbox "
                "SET next_attempt_at = next_attempt_at - make_interval(secs => :s)"
            ),
            {"s": seconds},
        )


# --- backoff and config: plain functions ------------------------------------------------------


def test_backoff_grows_by_factor_up_to_the_cap() -> None:
    delays = [
        backoff_seconds(n, base=60, factor=2.0, cap=1800, jitter_ratio=0.0) for n in range(1, 9)
    ]
    assert delays == [60, 120, 240, 480, 960, 1800, 1800, 1800]
    assert backoff_seconds(10_000, base=60, factor=2.0, cap=1800, jitter_ratio=0.0) == 1800


def test_backoff_jitter_comes_from_the_injected_random_source() -> None:
    args = {"base": 60, "factor": 2.0, "cap": 1800, "jitter_ratio": 0.1}
    assert backoff_seconds(1, rand=lambda: 0.0, **args) == 60
    assert backoff_seconds(1, rand=lambda: 0.5, **args) == pytest.approx(63)
    assert backoff_seconds(6, rand=lambda: 0.999, **args) == pytest.approx(1800 * 1.0999)
    with pytest.raises(ValueError, match="attempts"):
        backoff_seconds(0, **args)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("max_attempts", 0),
        ("backoff_base_seconds", 0),
        ("backoff_factor", 0.5),
        ("backoff_cap_seconds", 1),
        ("max_run_duration_seconds", -1),
        ("lock_ttl_seconds", 0),
        ("max_concurrency", 0),
    ],
)
def test_config_error_names_the_field(field: str, value: float) -> None:
    with pytest.raises(SnapshotDetachConfigError, match=field):
        DetachOptions(**{field: value}).validate()


def test_client_classifies_answers() -> None:
    from pin_orchestration.news.selections import classify_status

    assert classify_status(200).kind == CallKind.DETACHED
    assert classify_status(204).kind == CallKind.DETACHED
    assert classify_status(503) == CallResult(CallKind.TRANSIENT, "http_503")
    assert classify_status(404) == CallResult(CallKind.REJECTED, "http_404")
    with pytest.raises(ValueError, match="detach_call_timeout_seconds"):
        SelectionsClient("http://127.0.0.1:1", None, timeout_seconds=0)


# --- DET-1: enqueue in the caller's transaction, one active row per snapshot -------------------


def test_enqueue_dedupes_per_snapshot_while_a_row_is_active(db_engine: Engine) -> None:
    snapshot, post = uuid.uuid4(), uuid.uuid4()
    with db_engine.begin() as conn:
        first = enqueue_snapshot_detach(conn, snapshot, post, Reason.BLOCK_REPLACED)
        again = enqueue_snapshot_detach(conn, snapshot, post, "PostDeleted")
    assert first == again
    assert first.version == 7
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.reason, entry.last_error) == (
        "Pending",
        0,
        "BlockReplaced",
        None,
    )
    # Once Done, the snapshot may be enqueued again (ux_sdo_snapshot is partial).
    with db_engine.begin() as conn:
        conn.execute(text("UPDATE news.snapshot_detach_outbox SET status = 'Done'"))
        third = enqueue_snapshot_detach(conn, snapshot, post, Reason.POST_DELETED)
    assert third != first
    assert statuses(db_engine) == {"Done": 1, "Pending": 1}


def test_enqueue_survives_the_active_row_turning_done_meanwhile(db_engine: Engine) -> None:
    """The owner's transaction enqueues a snapshot that has an active row; a worker on
    another connection commits that row Done right after the owner's first statement. The
    enqueue must neither raise inside the owner's transaction nor leave it without an id."""
    snapshot, post = uuid.uuid4(), uuid.uuid4()
    [active] = [enqueue_id(db_engine, snapshot, post)]
    statements: list[str] = []

    def worker_marks_done(conn, cursor, statement, *args) -> None:
        statements.append(statement)
        if len(statements) == 1:
            with db_engine.begin() as worker:
                worker.execute(
                    text("UPDATE news.snapshot_detach_outbox SET status = 'Done' WHERE id = :id"),
                    {"id": active},
                )

    with db_engine.begin() as owner:
        event.listen(owner, "after_cursor_execute", worker_marks_done)
        entry_id = enqueue_snapshot_detach(owner, snapshot, post, Reason.POST_DELETED)
        owner.execute(text("SELECT 1"))  # the owner's own work goes on in the same transaction
    assert len(statements) == 2  # the enqueue was one statement
    assert entry_id == active
    assert statuses(db_engine) == {"Done": 1}


def enqueue_id(engine: Engine, snapshot: uuid.UUID, post: uuid.UUID) -> uuid.UUID:
    with engine.begin() as conn:
        return enqueue_snapshot_detach(conn, snapshot, post, Reason.BLOCK_REPLACED)


def test_enqueue_is_part_of_the_callers_transaction(db_engine: Engine) -> None:
    with pytest.raises(RuntimeError), db_engine.begin() as conn:
        enqueue_snapshot_detach(conn, uuid.uuid4(), uuid.uuid4(), Reason.POST_DELETED)
        raise RuntimeError("the owner's set-blocks failed")
    assert statuses(db_engine) == {}
    with pytest.raises(ValueError, match="Unknown"), db_engine.begin() as conn:
        enqueue_snapshot_detach(conn, uuid.uuid4(), uuid.uuid4(), "Unknown")


# --- DET-8 seed table ---------------------------------------------------------------------------


def test_successful_detach_marks_done(db_engine: Engine, selections: Selections) -> None:
    [snapshot] = enqueue(db_engine, reason=Reason.POST_DELETED)
    result = run(db_engine, selections)
    assert (result.status, result.succeeded, result.claimed) == (RunStatus.SUCCEEDED, 1, 1)
    assert selections.calls == [(str(snapshot), {"reason": "PostDeleted"}, f"Bearer {TOKEN}")]
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == ("Done", 1, None)
    with db_engine.connect() as conn:
        recorded = conn.execute(
            text("SELECT status, result FROM pin.job_runs WHERE job_code = :c"),
            {"c": "news-snapshot-detach-retry"},
        ).one()
    assert recorded.status == "succeeded"
    assert recorded.result["succeeded"] == 1


def test_empty_run_makes_no_calls(db_engine: Engine, selections: Selections) -> None:
    [snapshot] = enqueue(db_engine)
    with db_engine.begin() as conn:  # a row that is not due yet
        conn.execute(
            text("UPDATE news.snapshot_detach_outbox SET next_attempt_at = now() + interval '1 h'")
        )
    result = run(db_engine, selections)
    assert (result.status, result.claimed, result.batches) == (RunStatus.SUCCEEDED, 0, 0)
    assert selections.calls == []
    assert row(db_engine, snapshot).attempts == 0


def test_selections_5xx_keeps_pending_with_backoff_then_retries(
    db_engine: Engine, selections: Selections
) -> None:
    [snapshot] = enqueue(db_engine)
    selections.status = 503
    before = datetime.now(UTC)
    result = run(db_engine, selections)
    assert (result.failed, result.retried, result.succeeded) == (1, 1, 0)
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == ("Pending", 1, "transient:http_503")
    assert (
        before + timedelta(seconds=60)
        <= entry.next_attempt_at
        <= datetime.now(UTC) + timedelta(seconds=60)
    )
    # Not due again before its backoff: a run now calls nothing.
    assert run(db_engine, selections).claimed == 0
    assert len(selections.calls) == 1
    # After the backoff the next run retries; the second failure doubles the delay.
    elapse(db_engine, 61)
    result = run(db_engine, selections)
    entry = row(db_engine, snapshot)
    assert (entry.attempts, result.retried) == (2, 1)
    delay = (entry.next_attempt_at - entry.updated_at).total_seconds()
    assert delay == pytest.approx(120, abs=1)  # updated_at is the outcome, just after the claim
    # selections is back: the row is detached.
    selections.status = 200
    elapse(db_engine, 121)
    result = run(db_engine, selections)
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == ("Done", 3, None)
    assert len(selections.calls) == 3


def test_call_hanging_past_the_timeout_is_transient(
    db_engine: Engine, selections: Selections
) -> None:
    [snapshot] = enqueue(db_engine)
    selections.hang = threading.Event()
    started = time.monotonic()
    result = run(db_engine, selections, timeout=0.3)
    # The call hangs until the test ends: only its timeout can have ended the run. The
    # bound only ends a broken run, it measures nothing.
    assert time.monotonic() - started < 60
    assert result.retried == 1
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == ("Pending", 1, "transient:timeout")


def test_network_failure_is_transient(db_engine: Engine) -> None:
    [snapshot] = enqueue(db_engine)
    with HTTPServer(host="127.0.0.1", port=0) as closed:
        url = closed.url_for("")
    with SelectionsClient(url, TOKEN, timeout_seconds=1) as c:
        result = run_detach_retry(db_engine, c, NO_JITTER, run_id="r", holder="h", rand=zero)
    assert result.retried == 1
    assert row(db_engine, snapshot).last_error == "transient:network:ConnectionError"


def test_4xx_is_kept_for_retry_and_says_so(db_engine: Engine, selections: Selections) -> None:
    [snapshot] = enqueue(db_engine)
    selections.status = 404
    run(db_engine, selections)
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.last_error) == ("Pending", "rejected:http_404")


def test_already_detached_snapshot_is_done(db_engine: Engine, selections: Selections) -> None:
    # selections answers a repeated detach of a Detached snapshot with a no-op 2xx.
    [snapshot] = enqueue(db_engine)
    selections.status = 204
    with db_engine.begin() as conn:  # an earlier attempt timed out after selections detached
        conn.execute(
            text(
                "UPDATE news.snapshot_detach_outbox "
                "SET attempts = 3, last_error = 'transient:timeout'"
            )
        )
    result = run(db_engine, selections)
    assert result.succeeded == 1
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == ("Done", 4, None)


def test_poison_is_quarantined_with_an_alert_and_left_alone(
    db_engine: Engine, selections: Selections, caplog: pytest.LogCaptureFixture
) -> None:
    [snapshot, healthy] = enqueue(db_engine, 2)
    options = DetachOptions(max_attempts=3, backoff_jitter_ratio=0)
    with db_engine.begin() as conn:
        conn.execute(
            text("UPDATE news.snapshot_detach_outbox SET attempts = 2 WHERE snapshot_id = :s"),
            {"s": snapshot},
        )
    selections.status = 500
    with caplog.at_level(logging.INFO, logger="pin_orchestration"):
        result = run(db_engine, selections, options)
    assert (result.quarantined, result.retried) == (1, 1)
    [event] = result.quarantine_events
    assert (event.snapshot_id, event.attempts, event.reason) == (snapshot, 3, "BlockReplaced")
    assert "SnapshotDetachQuarantinedEvent" in caplog.text
    assert any(
        r.levelno == logging.ERROR and "quarantined" in r.getMessage() for r in caplog.records
    )
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == (
        "Quarantined",
        3,
        "transient:http_500",
    )
    # Excluded from the claim: far in the future, only the healthy row is taken.
    selections.status = 200
    elapse(db_engine, 10 * 86400)
    result = run(db_engine, selections, options)
    assert result.claimed == 1
    assert selections.called()[str(snapshot)] == 1
    assert row(db_engine, healthy).status == "Done"
    assert row(db_engine, snapshot).status == "Quarantined"


def test_requeue_puts_a_quarantined_row_back_with_a_fresh_budget(
    db_engine: Engine, selections: Selections
) -> None:
    [snapshot] = enqueue(db_engine)
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE news.snapshot_detach_outbox SET status = 'Quarantined', attempts = 12, "
                "last_error = 'transient:http_503', next_attempt_at = now() + interval '1 day'"
            )
        )
    entry_id = requeue_quarantined(db_engine, snapshot_id=snapshot)
    entry = row(db_engine, snapshot)
    assert (entry.id, entry.status, entry.attempts, entry.last_error) == (
        entry_id,
        "Pending",
        0,
        None,
    )
    with pytest.raises(RequeueError, match="no Quarantined"):
        requeue_quarantined(db_engine, entry_id=entry_id)
    with pytest.raises(RequeueError, match="exactly one"):
        requeue_quarantined(db_engine)
    assert run(db_engine, selections).succeeded == 1


def test_parallel_claimers_never_take_the_same_row(db_engine: Engine) -> None:
    enqueue(db_engine, 300)
    options = DetachOptions(batch_size=200)
    both_claimed = threading.Barrier(2, timeout=10)
    start = threading.Barrier(2, timeout=10)
    claims: dict[str, list[uuid.UUID]] = {}
    errors: list[BaseException] = []

    def claimer(name: str) -> None:
        try:
            with db_engine.connect() as conn, conn.begin():
                start.wait()
                claimed = claim_due(conn, options, zero)
                # Both transactions hold their row locks at this point.
                both_claimed.wait()
            claims[name] = [e.id for e in claimed]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    a, b = set(claims["a"]), set(claims["b"])
    assert a and b and not a & b
    assert len(a | b) == 300
    with db_engine.connect() as conn:
        assert conn.execute(
            text("SELECT attempts, count(*) FROM news.snapshot_detach_outbox GROUP BY attempts")
        ).all() == [(1, 300)]


def test_an_autocommit_claim_never_takes_a_row_changed_after_it_was_read(
    db_engine: Engine,
) -> None:
    """On the drain's autocommit connection lock_due's row locks end with its statement:
    a row another claimer stamps before mark_claimed stays that claimer's."""
    enqueue(db_engine, 3)
    stolen: list[uuid.UUID] = []
    with db_engine.connect() as conn:
        autocommit(conn)

        @event.listens_for(conn, "after_cursor_execute")
        def steal_one(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
            if "FOR UPDATE SKIP LOCKED" in statement and not stolen:
                with db_engine.begin() as other:
                    stolen.append(
                        other.execute(
                            text(
                                "UPDATE news.snapshot_detach_outbox SET attempts = 1, "
                                "next_attempt_at = now() + interval '1 hour' "
                                "WHERE id = (SELECT id FROM news.snapshot_detach_outbox "
                                "ORDER BY next_attempt_at LIMIT 1) RETURNING id"
                            )
                        ).scalar_one()
                    )

        claimed = claim_due(conn, NO_JITTER, zero)
    assert len(stolen) == 1
    assert len(claimed) == 2 and stolen[0] not in {e.id for e in claimed}
    with db_engine.connect() as conn:
        assert conn.execute(
            text("SELECT attempts, count(*) FROM news.snapshot_detach_outbox GROUP BY attempts")
        ).all() == [(1, 3)]


def test_a_claim_reads_in_the_index_order_without_sorting_the_due_rows(
    db_engine: Engine,
) -> None:
    """A burst enqueued in one transaction shares one due time: a claim ordered past the
    index (next_attempt_at, id) sorted every one of them, each claim (~20 ms at 10,000)."""
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO news.snapshot_detach_outbox (id, snapshot_id, post_id, reason) "
                "SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), "
                "'BlockReplaced' FROM generate_series(1, 5000)"
            )
        )
    with db_engine.connect() as conn:
        conn.execute(text("ANALYZE news.snapshot_detach_outbox"))
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                text("EXPLAIN " + query("lock_due").text), {"batch_size": 32}
            ).all()
        )
    assert "ix_sdo_due" in plan and "Sort" not in plan, plan


def test_parallel_runners_detach_each_snapshot_once(
    db_engine: Engine, selections: Selections
) -> None:
    snapshots = enqueue(db_engine, 400)
    options = DetachOptions(batch_size=25, max_concurrency=4, backoff_jitter_ratio=0)
    go = threading.Barrier(2, timeout=10)
    results = []

    def runner() -> None:
        with client(selections, pool=4) as c:
            go.wait()
            # drain() directly: the lock would keep the second runner out (tested below);
            # this is the failover case where two runners overlap.
            results.append(drain(db_engine, c, options, rand=zero))

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 2
    assert all(r.claimed > 0 for r in results)
    assert sum(r.succeeded for r in results) == 400
    assert selections.called() == Counter({str(s): 1 for s in snapshots})
    assert statuses(db_engine) == {"Done": 400}


def test_hanging_selections_never_gets_a_row_twice_at_once_and_backs_off_from_the_call(
    db_engine: Engine, selections: Selections, caplog: pytest.LogCaptureFixture
) -> None:
    """100 rows, 8 call slots, every call hangs until its 0.2 s timeout, base backoff 1 s:
    the whole claim takes far longer than the backoff. No row may be claimed again while
    its call is in flight, and its next call comes a backoff after the failed call ended,
    not after the claim."""
    enqueue(db_engine, 100)
    timeout, base = 0.2, 1.0
    starts: dict[str, list[float]] = {}
    guard = threading.Lock()

    def on_call(snapshot: str) -> None:
        with guard:
            starts.setdefault(snapshot, []).append(time.monotonic())

    selections.on_call = on_call
    selections.hang = threading.Event()
    options = DetachOptions(
        batch_size=100,
        max_concurrency=8,
        backoff_base_seconds=base,
        backoff_factor=1.0,
        # Real jitter: the rows' retry order differs from their first order, so a row called
        # late in one claim can come early in the next.
        backoff_jitter_ratio=1.0,
        max_run_duration_seconds=3.5,
        max_attempts=100,
    )
    with caplog.at_level(logging.INFO, logger="pin_orchestration"):
        result = run(db_engine, selections, options, timeout=timeout, rand=random.random)
    assert result.succeeded == 0 and result.released == 0
    retried = {s: t for s, t in starts.items() if len(t) > 1}
    assert retried, "the run should have outlived the backoff of its first calls"
    for snapshot, times in retried.items():
        for earlier, later_call in zip(times, times[1:], strict=False):
            # The earlier call hung for its whole timeout, then the backoff ran from its end.
            assert later_call - earlier >= timeout + base - 0.05, snapshot
    claims = [
        int(r.getMessage().rsplit("rows=", 1)[1])
        for r in caplog.records
        if "batch claimed" in r.getMessage()
    ]
    # The calls in flight and QUEUED_ROUNDS rounds of calls queued behind them, never more.
    assert max(claims) <= (QUEUED_ROUNDS + 1) * options.max_concurrency
    assert sum(claims) == result.claimed == sum(len(t) for t in starts.values())


def test_lock_held_elsewhere_skips_the_run(db_engine: Engine, selections: Selections) -> None:
    enqueue(db_engine)
    assert try_acquire_lock(db_engine, DETACH_JOB.lock_key, 60, "another-pod")
    result = run(db_engine, selections)
    assert result.status == RunStatus.SKIPPED
    assert selections.calls == []
    assert statuses(db_engine) == {"Pending": 1}


def test_concurrency_is_bounded(db_engine: Engine, selections: Selections) -> None:
    enqueue(db_engine, 30)
    in_flight = 0
    peak = 0
    guard = threading.Lock()

    def on_call(_snapshot: str) -> None:
        nonlocal in_flight, peak
        with guard:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.02)  # the stand-in's latency, so calls overlap
        with guard:
            in_flight -= 1

    selections.on_call = on_call
    result = run(db_engine, selections, DetachOptions(batch_size=10, max_concurrency=3))
    assert result.succeeded == 30
    assert 2 <= peak <= 3


def test_cancellation_between_records_is_graceful(
    db_engine: Engine, selections: Selections
) -> None:
    snapshots = enqueue(db_engine, 10)
    stop = threading.Event()
    selections.on_call = lambda _s: stop.set()
    result = run(db_engine, selections, DetachOptions(max_concurrency=1), stop_requested=stop)
    assert result.status == RunStatus.CANCELLED
    called = selections.called()
    assert len(called) == 1  # one worker: the stop lands during the first call
    assert result.succeeded == len(called)
    # A claim takes the free call slots and QUEUED_ROUNDS rounds queued behind them: what
    # was claimed and not called is given back its attempt.
    assert result.claimed == len(called) + result.released
    assert result.released <= QUEUED_ROUNDS
    for snapshot in snapshots:
        entry = row(db_engine, snapshot)
        if str(snapshot) in called:
            assert (entry.status, entry.attempts) == ("Done", 1)
        else:  # never claimed, never called: due as before
            assert (entry.status, entry.attempts) == ("Pending", 0)
            assert entry.next_attempt_at <= datetime.now(UTC)
    with db_engine.connect() as conn:
        assert (
            conn.execute(
                text(
                    "SELECT status FROM pin.job_runs WHERE job_code = 'news-snapshot-detach-retry'"
                )
            ).scalar_one()
            == "cancelled"
        )


def test_outcome_never_overwrites_a_newer_claim(db_engine: Engine) -> None:
    [snapshot] = enqueue(db_engine)
    [first] = claim_batch(db_engine, NO_JITTER, zero)
    # The first runner's call is slow; after the backoff another runner claims the row again.
    elapse(db_engine, 61)
    [second] = claim_batch(db_engine, NO_JITTER, zero)
    assert (first.id, first.attempts, second.attempts) == (second.id, 1, 2)
    late = decide(first, CallResult(CallKind.TRANSIENT, "http_503"), NO_JITTER)
    assert record_outcomes(db_engine, [late]) == {}
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == ("Pending", 2, None)
    assert entry.next_attempt_at == second.next_attempt_at
    done = decide(second, CallResult(CallKind.DETACHED, "http_200"), NO_JITTER)
    assert record_outcomes(db_engine, [done]).keys() == {second.id}
    assert row(db_engine, snapshot).status == "Done"


_CRASH_CHILD = textwrap.dedent(
    """
    import sys
    from pin_orchestration.platform.db import create_db_engine
    from pin_orchestration.news.selections import SelectionsClient
    from pin_orchestration.news.snapshot_detach.policy import DetachOptions
    from pin_orchestration.news.snapshot_detach.worker import drain

    engine = create_db_engine(sys.argv[1])
    with SelectionsClient(sys.argv[2], "t", timeout_seconds=30) as client:
        drain(engine, client, DetachOptions(backoff_jitter_ratio=0.0))
    """
)


def test_crash_between_claim_and_outcome_leaves_pending_with_backoff(
    db_url: str, db_engine: Engine, selections: Selections
) -> None:
    [snapshot] = enqueue(db_engine)
    in_call = threading.Event()
    selections.on_call = lambda _s: in_call.set()
    selections.hang = threading.Event()
    before = datetime.now(UTC)
    child = subprocess.Popen([sys.executable, "-c", _CRASH_CHILD, db_url, selections.url])
    try:
        assert in_call.wait(30), "the child never called selections"
        # The call is in flight: the claim is committed, nothing holds the row or a transaction.
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "SELECT 1 FROM news.snapshot_detach_outbox WHERE snapshot_id = :s "
                    "FOR UPDATE NOWAIT"
                ),
                {"s": snapshot},
            )
            idle_in_tx = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        assert idle_in_tx == 0
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    selections.hang.set()
    selections.hang = None
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts, entry.last_error) == ("Pending", 1, None)
    # The claim's lease: QUEUED_ROUNDS + 1 call timeouts (30 s in the child: the wait in
    # the pool's queue and the call), then the backoff.
    lease = (QUEUED_ROUNDS + 1) * 30 + 60
    assert entry.next_attempt_at >= before + timedelta(seconds=lease)
    # The next run after the lease finishes it.
    assert run(db_engine, selections).claimed == 0
    elapse(db_engine, lease + 1)
    result = run(db_engine, selections)
    assert result.succeeded == 1
    entry = row(db_engine, snapshot)
    assert (entry.status, entry.attempts) == ("Done", 2)


def test_demo_rows_are_idempotent_and_drain_against_the_stand_in(db_engine: Engine) -> None:
    from pin_orchestration.devstack.demo import seed_snapshot_detach_outbox
    from pin_orchestration.devstack.standins.selections import SelectionsStandIn

    assert seed_snapshot_detach_outbox(db_engine) == {"snapshot_detach_outbox": 14}
    assert seed_snapshot_detach_outbox(db_engine) == {"snapshot_detach_outbox": 0}
    with SelectionsStandIn() as stand_in, SelectionsClient(stand_in.url, None) as c:
        result = run_detach_retry(db_engine, c, NO_JITTER, run_id="demo", holder="demo")
    assert result.succeeded == 12
    assert statuses(db_engine) == {"Done": 12, "Quarantined": 2}
    # Rows broken on purpose say so, so nobody chases a fake outage in the demo.
    with db_engine.connect() as conn:
        errors = conn.execute(
            text("SELECT last_error FROM news.snapshot_detach_outbox WHERE status = 'Quarantined'")
        ).scalars()
        assert all(error.startswith("DEMO: quarantined on purpose") for error in errors)


def test_metrics_come_from_postgres(db_engine: Engine, selections: Selections) -> None:
    from prometheus_client import generate_latest

    from pin_orchestration.areas import metrics_registry

    def scrape() -> dict[str, float]:
        text_format = generate_latest(metrics_registry(db_engine)).decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text_format.splitlines()
            if line.startswith("news_snapshot_detach_")
        }

    enqueue(db_engine, 3)
    assert scrape()["news_snapshot_detach_pending"] == 3
    run(db_engine, selections)  # success: succeeded_total += 3
    [flaky, poison] = enqueue(db_engine, 2)
    with db_engine.begin() as conn:
        conn.execute(
            text("UPDATE news.snapshot_detach_outbox SET attempts = 11 WHERE snapshot_id = :s"),
            {"s": poison},
        )
    selections.status = 503
    run(db_engine, selections)
    metrics = scrape()
    assert metrics["news_snapshot_detach_succeeded_total"] == 3
    assert metrics["news_snapshot_detach_retried_total"] == 1
    assert metrics["news_snapshot_detach_quarantined_total"] == 1
    assert metrics["news_snapshot_detach_failed_total"] == 2
    assert metrics["news_snapshot_detach_pending"] == 1
    assert metrics["news_snapshot_detach_oldest_age_seconds"] >= 0
    assert metrics["news_snapshot_detach_lag_seconds_count"] == 3
    assert metrics['news_snapshot_detach_lag_seconds_bucket{le="60"}'] == 3
    assert row(db_engine, flaky).status == "Pending"


def test_max_run_duration_leaves_the_rest_for_the_next_tick(
    db_engine: Engine, selections: Selections
) -> None:
    enqueue(db_engine, 30)
    selections.on_call = lambda _s: time.sleep(0.02)
    options = DetachOptions(batch_size=10, max_concurrency=1, max_run_duration_seconds=0.05)
    result = run(db_engine, selections, options)
    assert result.backlog_remaining is True
    assert result.succeeded == result.claimed < 30
    assert statuses(db_engine) == {"Done": result.claimed, "Pending": 30 - result.claimed}


def test_lock_is_renewed_while_a_run_outlasts_its_ttl(
    db_engine: Engine, selections: Selections
) -> None:
    """The calls wait at a gate until the run's lock has been renewed past its first
    expiry; a second runner never gets the lock meanwhile (no transaction is open while a
    call is in flight, so only the renewal keeps it), and the run then detaches everything.
    The TTL is long enough (renewed every 2 s) that a starved machine cannot let it lapse
    between two renewals, and the calls' timeout longer than the wait at the gate."""
    enqueue(db_engine, 30)
    gate, first_call = threading.Event(), threading.Event()

    def held_at_the_gate(_snapshot: str) -> None:
        first_call.set()
        assert gate.wait(60)

    selections.on_call = held_at_the_gate
    options = DetachOptions(max_concurrency=2, lock_ttl_seconds=6, backoff_jitter_ratio=0)
    results = []
    worker = threading.Thread(
        target=lambda: results.append(run(db_engine, selections, options, timeout=120))
    )
    worker.start()
    try:
        assert first_call.wait(30)
        (first,) = list_locks(db_engine)
        deadline = time.monotonic() + 60
        while list_locks(db_engine)[0].expires_at < first.expires_at + timedelta(
            seconds=options.lock_ttl_seconds
        ):
            assert not try_acquire_lock(db_engine, DETACH_JOB.lock_key, 60, "second-runner"), (
                "a second runner took the lock while the first was working"
            )
            assert time.monotonic() < deadline, "the lock was not renewed past its first expiry"
            time.sleep(0.05)
    finally:
        gate.set()
        worker.join(60)
    assert results[0].succeeded == 30


def test_run_stops_at_once_when_its_lock_is_lost(db_engine: Engine, selections: Selections) -> None:
    """Every call waits at a gate until the run has logged its lock lost, so the run can
    only end by noticing the loss (its renewal, a third of the TTL): the calls in flight
    then finish, and nothing more is claimed."""
    enqueue(db_engine, 100)
    first_call = threading.Event()
    lost = LogSeen("lost by test")

    def held_until_the_loss_is_seen(_snapshot: str) -> None:
        first_call.set()
        assert lost.seen.wait(60)

    selections.on_call = held_until_the_loss_is_seen
    options = DetachOptions(max_concurrency=2, lock_ttl_seconds=1, backoff_jitter_ratio=0)
    results = []
    worker = threading.Thread(
        target=lambda: results.append(run(db_engine, selections, options, timeout=120))
    )
    with watching_log("pin_orchestration.coordination.locks", lost):
        worker.start()
        try:
            assert first_call.wait(30)
            # An operator drops the lock (`pin locks release`) and another runner takes it.
            with db_engine.begin() as conn:
                conn.execute(text("DELETE FROM pin.distributed_locks"))
            assert try_acquire_lock(db_engine, DETACH_JOB.lock_key, 60, "second-runner")
        finally:
            worker.join(60)
    assert not worker.is_alive()
    result = results[0]
    assert result.status == RunStatus.FAILED
    assert "lock" in (result.error or "")
    assert statuses(db_engine)["Pending"] > 50
