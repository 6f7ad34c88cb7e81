"""The areas' alert checks, each judged from real rows: the seeds' alerts (thresholds as
config), read by pin_alert_checks, on the unpartitioned health asset of their area."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from dagster import DagsterInstance, ExecuteInProcessResult
from sqlalchemy import Engine, text

from pin_orchestration.chessboard.drain import drain_tick
from pin_orchestration.chessboard.metrics import chessboard_recalc_counters, record_outcomes
from pin_orchestration.chessboard.outcomes import ProjectOutcome
from pin_orchestration.coordination.jobruns import record_failed_run, record_job_run
from pin_orchestration.coordination.queue_health import counter_increase, quantile_upper_bound
from pin_orchestration.definitions import build_definitions
from pin_orchestration.news.snapshot_detach.policy import DETACH_JOB
from pin_orchestration.platform.ids import uuid7

# The checks on their assets, as the UI names them.
BACKLOG = "chessboard/recalc_health:CHESSBOARD_RECALC_BACKLOG"
P99 = "chessboard/recalc_health:process_p99_within_slo"
RECALC_ERRORS = "chessboard/recalc_health:recalc_errors_not_growing"
LIVENESS = "chessboard/recalc_health:recalc_worker_alive"
SCRAPING_STALLED = "scraping/jobs_health:scraping_queue_not_stalled"
PAST_LEASE = "scraping/jobs_health:no_jobs_past_lease"
START_SLO = "scraping/jobs_health:jobs_start_within_a_minute"
TERMINAL_SLO = "scraping/jobs_health:jobs_terminal_without_a_human"
PENDING = "news/snapshot_detach_outbox:pending_not_growing"
FAILED_CALLS = "news/snapshot_detach_outbox:no_failed_calls_spike"
RECONCILE_ERRORS = "news/comment_reconcile_health:no_failed_runs_in_26h"


def add_recalc_request(engine: Engine, minutes_overdue: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO chessboard.project_recalc_requests
                    (project_id, tenant_id, due_at, first_requested_at, last_reason,
                     created_at, updated_at)
                VALUES (:p, :t, now() - make_interval(secs => :s), now(), 'test', now(), now())
                """
            ),
            {"p": uuid.uuid4(), "t": uuid.uuid4(), "s": minutes_overdue * 60},
        )


def add_tenant(engine: Engine) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text(
                """
                INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix)
                VALUES (:id, :name, :sha, 'k') RETURNING id
                """
            ),
            {"id": uuid.uuid4(), "name": f"t{uuid.uuid4().hex[:8]}", "sha": uuid.uuid4().bytes},
        ).scalar_one()


def add_scraping_job(
    engine: Engine,
    status: str,
    minutes_ago: float,
    *,
    started_after_seconds: float | None = None,
    requeued_by_a_human: bool = False,
) -> None:
    """A job accepted `minutes_ago` (its id minted now, as UUIDv7 ids of recent jobs are),
    first started `started_after_seconds` after acceptance."""
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO scraping.jobs
                    (id, tenant_id, url, domain, status, next_attempt_at, created_at,
                     started_at, attempts, attempts_before_requeue,
                     lease_owner, lease_expires_at, result_key, finished_at)
                VALUES (:id, :tenant, 'https://example.org/', 'example.org', :status,
                        now() - make_interval(secs => :ago),
                        now() - make_interval(secs => :ago),
                        now() - make_interval(secs => :ago) + make_interval(secs => :start),
                        :attempts, :before_requeue,
                        CASE WHEN :status = 'running' THEN 'worker' END,
                        CASE WHEN :status = 'running' THEN now() - make_interval(secs => :ago) END,
                        CASE WHEN :status = 'succeeded' THEN 'results/k' END,
                        CASE WHEN :status IN ('succeeded', 'failed') THEN now() END)
                """
            ),
            {
                "id": uuid7(),
                "tenant": add_tenant(engine),
                "status": status,
                "ago": minutes_ago * 60,
                "start": started_after_seconds,
                "attempts": 1 if started_after_seconds is not None else 0,
                "before_requeue": 1 if requeued_by_a_human else 0,
            },
        )


def run_alert_checks(
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    run_config: dict | None = None,
    instance: DagsterInstance | None = None,
) -> ExecuteInProcessResult:
    """pin_alert_checks run once, in process."""
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    # Resolved inside an entered instance: loading definitions reads Dagster's current
    # defs-state storage, which an instance sets while entered; left to an earlier test's
    # instance, since collected, it raised "undefined DagsterInstance weakref" (once, here).
    with DagsterInstance.ephemeral() as ephemeral:
        return (
            build_definitions()
            .resolve_job_def("pin_alert_checks")
            .execute_in_process(run_config=run_config or {}, instance=instance or ephemeral)
        )


def alert_checks(
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    run_config: dict | None = None,
    instance: DagsterInstance | None = None,
) -> dict[str, bool]:
    """pin_alert_checks run once: every check's outcome, by `asset:check`."""
    outcome = run_alert_checks(db_url, monkeypatch, run_config, instance)
    return {
        f"{e.asset_key.to_user_string()}:{e.check_name}": e.passed
        for e in outcome.get_asset_check_evaluations()
    }


def checks_config(asset: str, check: str, **config: object) -> dict:
    op = f"{asset.replace('/', '__')}_{check}"
    return {"ops": {op: {"config": config}}}


def test_every_alert_passes_on_healthy_queues(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_recalc_request(db_engine, minutes_overdue=1)
    record_outcomes(db_engine, [])  # a drain ticked just now
    add_scraping_job(db_engine, "queued", minutes_ago=0.5)
    record_job_run(
        db_engine,
        job_code="news-comment-reconcile",
        run_id="r0",
        status="succeeded",
        started_at=datetime.now(UTC),
        result={},
    )
    add_scraping_job(db_engine, "succeeded", minutes_ago=90, started_after_seconds=5)
    checks = alert_checks(db_url, monkeypatch)
    assert [name for name, passed in checks.items() if not passed] == []
    assert len(checks) == 19  # every alert of every area ran


def test_old_backlog_and_expired_leases_fail_their_checks(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_recalc_request(db_engine, minutes_overdue=6)  # past the seed's 5 min
    add_scraping_job(db_engine, "queued", minutes_ago=30)
    add_scraping_job(db_engine, "running", minutes_ago=5, started_after_seconds=1)
    checks = alert_checks(db_url, monkeypatch)
    assert {n: checks[n] for n in (BACKLOG, SCRAPING_STALLED, PAST_LEASE, LIVENESS)} == {
        BACKLOG: False,
        SCRAPING_STALLED: False,
        PAST_LEASE: False,
        LIVENESS: False,  # due work and no drain tick ever
    }


def test_the_backlog_threshold_is_the_checks_config(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_recalc_request(db_engine, minutes_overdue=2)
    assert alert_checks(db_url, monkeypatch)[BACKLOG]
    strict = checks_config(
        "chessboard/recalc_health", "CHESSBOARD_RECALC_BACKLOG", max_oldest_due_seconds=60
    )
    assert not alert_checks(db_url, monkeypatch, strict)[BACKLOG]


def outcome(result: str, seconds: float) -> ProjectOutcome:
    return ProjectOutcome(
        project_id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        result=result,  # type: ignore[arg-type]
        duration_seconds=seconds,
        requested_count=1,
        last_reason="test",
    )


def test_process_p99_over_the_slo_and_growing_errors_fail(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_outcomes(db_engine, [outcome("recalculated", 0.01)] * 99)
    record_outcomes(db_engine, [outcome("recalculated", 1.5)])
    checks = alert_checks(db_url, monkeypatch)
    assert checks[P99] and checks[RECALC_ERRORS]  # p99 <= 2 s at bucket 2.0: 100/100

    record_outcomes(db_engine, [outcome("recalculated", 3.0)] * 2)  # 2 of 102 over 2 s
    record_outcomes(db_engine, [outcome("failed", 0.02)])
    checks = alert_checks(db_url, monkeypatch)
    assert (checks[P99], checks[RECALC_ERRORS]) == (False, False)


def test_growth_is_measured_since_the_observation_a_window_ago(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Errors before the window's start observation are old news: the check compares the
    counter with what the health asset recorded window_seconds ago."""
    record_outcomes(db_engine, [outcome("failed", 0.02)])
    with DagsterInstance.ephemeral() as instance:
        assert not alert_checks(db_url, monkeypatch, instance=instance)[RECALC_ERRORS]
        # The observation that run made is the window's start for a 1 ms window.
        tiny = checks_config(
            "chessboard/recalc_health", "recalc_errors_not_growing", window_seconds=0.001
        )
        assert alert_checks(db_url, monkeypatch, tiny, instance=instance)[RECALC_ERRORS]
        record_outcomes(db_engine, [outcome("failed", 0.02)])
        assert not alert_checks(db_url, monkeypatch, tiny, instance=instance)[RECALC_ERRORS]


def test_a_drain_tick_keeps_the_worker_alive(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_recalc_request(db_engine, minutes_overdue=2)
    assert not alert_checks(db_url, monkeypatch)[LIVENESS]
    record_outcomes(db_engine, [])
    assert alert_checks(db_url, monkeypatch)[LIVENESS]


def test_scraping_slo_jobs_start_within_a_minute(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(19):
        add_scraping_job(db_engine, "succeeded", minutes_ago=10, started_after_seconds=5)
    add_scraping_job(db_engine, "succeeded", minutes_ago=10, started_after_seconds=120)
    assert alert_checks(db_url, monkeypatch)[START_SLO]  # 19 of 20: 95 %
    add_scraping_job(db_engine, "queued", minutes_ago=3)  # still waiting: late
    assert not alert_checks(db_url, monkeypatch)[START_SLO]  # 19 of 21
    # Accepted under a minute ago: it has not had its minute yet, not counted.
    add_scraping_job(db_engine, "queued", minutes_ago=0.2)
    wide = checks_config("scraping/jobs_health", "jobs_start_within_a_minute", objective=0.9)
    assert alert_checks(db_url, monkeypatch, wide)[START_SLO]  # 19 of 21 >= 90 %


def test_scraping_slo_terminal_without_a_human(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(98):
        add_scraping_job(db_engine, "succeeded", minutes_ago=120, started_after_seconds=5)
    add_scraping_job(db_engine, "failed", minutes_ago=120, started_after_seconds=5)
    add_scraping_job(
        db_engine, "succeeded", minutes_ago=120, started_after_seconds=5, requeued_by_a_human=True
    )
    assert alert_checks(db_url, monkeypatch)[TERMINAL_SLO]  # 99 of 100
    add_scraping_job(db_engine, "running", minutes_ago=120, started_after_seconds=5)
    assert not alert_checks(db_url, monkeypatch)[TERMINAL_SLO]  # 99 of 101


def add_outbox_entry(engine: Engine, minutes_old: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO news.snapshot_detach_outbox
                    (id, snapshot_id, post_id, reason, created_at, next_attempt_at)
                VALUES (:id, :snapshot, :post, 'PostDeleted',
                        now() - make_interval(secs => :s), now() + interval '1 minute')
                """
            ),
            {"id": uuid7(), "snapshot": uuid.uuid4(), "post": uuid7(), "s": minutes_old * 60},
        )


def test_detach_pending_growing_and_failed_calls_spike(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_outbox_entry(db_engine, minutes_old=30)
    record_job_run(
        db_engine,
        job_code=DETACH_JOB.code,
        run_id="r1",
        status="succeeded",
        started_at=datetime.now(UTC) - timedelta(minutes=1),
        result={"failed": 10, "retried": 10},
    )
    checks = alert_checks(db_url, monkeypatch)
    assert (checks[PENDING], checks[FAILED_CALLS]) == (True, True)  # 30 min; 10 calls

    add_outbox_entry(db_engine, minutes_old=61)
    record_job_run(
        db_engine,
        job_code=DETACH_JOB.code,
        run_id="r2",
        status="succeeded",
        started_at=datetime.now(UTC) - timedelta(minutes=1),
        result={"failed": 1, "retried": 1},
    )
    checks = alert_checks(db_url, monkeypatch)
    assert (checks[PENDING], checks[FAILED_CALLS]) == (False, False)  # 61 min; 11 calls


def test_a_failed_run_fails_its_areas_errors_check(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed_runs = {
        "chessboard/recalc_health:no_failed_runs_in_1h": "chessboard_project_recalc_drain",
        "scraping/jobs_health:no_failed_runs_in_1h": "scraping_worker",
        "news/snapshot_detach_outbox:no_failed_runs_in_1h": DETACH_JOB.code,
        RECONCILE_ERRORS: "news-comment-reconcile",
    }
    checks = alert_checks(db_url, monkeypatch)
    assert all(checks[name] for name in failed_runs)
    for n, job_code in enumerate(failed_runs.values()):
        record_failed_run(
            db_engine, job_code=job_code, run_id=f"r{n}", started_at=datetime.now(UTC), error="x"
        )
        checks = alert_checks(db_url, monkeypatch)
        assert [c for c in failed_runs if not checks[c]] == list(failed_runs)[: n + 1]


def test_quantile_and_counter_arithmetic() -> None:
    histogram = {"0.1": 90.0, "1.0": 99.0, "2.0": 100.0, "+Inf": 100.0}
    assert quantile_upper_bound(histogram, 0.99) == 1.0
    assert quantile_upper_bound(histogram, 0.995) == 2.0
    assert quantile_upper_bound({"+Inf": 0.0}, 0.99) is None
    assert counter_increase({"a": 5.0}, {"a": 3.0}) == {"a": 2.0}
    assert counter_increase({"a": 1.0}, {"a": 3.0}) == {"a": 1.0}  # reset: counts from zero


def test_the_demos_quarantines_say_they_are_on_purpose(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pin_orchestration.assets.news_snapshot_detach import QUARANTINE_CHECK, outbox_evaluations
    from pin_orchestration.devstack.demo import seed_snapshot_detach_outbox
    from pin_orchestration.news.snapshot_detach.monitoring import demo_quarantined_ids

    seed_snapshot_detach_outbox(db_engine)
    demo_ids = demo_quarantined_ids(db_engine)
    assert len(demo_ids) == 2
    outcome = run_alert_checks(db_url, monkeypatch)
    # What the checks tab shows (the job) and what the sensor and drains report.
    reported = [
        e for e in outcome.get_asset_check_evaluations() if e.check_name == QUARANTINE_CHECK
    ] + [e for e in outbox_evaluations(db_engine) if e.check_name == QUARANTINE_CHECK]
    for evaluation in reported:
        assert not evaluation.passed
        assert "demo: quarantined on purpose; `pin detach requeue …` clears it" in (
            evaluation.description or ""
        )
        for entry in demo_ids:
            assert f"`pin detach requeue {entry}`" in (evaluation.description or "")
        assert evaluation.metadata["demo"].value.startswith("demo: quarantined on purpose")


def _last_tick_long_ago(engine: Engine) -> None:
    record_outcomes(engine, [])
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE chessboard.recalc_metrics SET updated_at = now() - interval '10 min'")
        )


def test_a_long_drain_tick_is_alive_while_it_works(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick of 50 projects at up to 2 s each outlasts the check's two 30 s intervals: the
    check run in the middle of a tick (the gate: the tick's first outcome) must see it."""
    for _ in range(3):
        add_recalc_request(db_engine, minutes_overdue=2)
    _last_tick_long_ago(db_engine)
    assert not alert_checks(db_url, monkeypatch)[LIVENESS]
    seen_mid_tick: list[bool] = []

    def check_mid_tick(outcome: ProjectOutcome) -> None:
        if not seen_mid_tick:
            seen_mid_tick.append(alert_checks(db_url, monkeypatch)[LIVENESS])

    drain_tick(db_engine, on_outcome=check_mid_tick)
    assert seen_mid_tick == [True]


def test_a_drain_tick_beats_once_a_tick_not_once_a_project(db_engine: Engine) -> None:
    for _ in range(3):
        add_recalc_request(db_engine, minutes_overdue=2)
    _last_tick_long_ago(db_engine)
    # Read at the tick's start, before each project (and after a beat), before the look
    # for a fourth project that finds none.
    clock = iter([0.0, 0.0, 1.0, 6.0, 6.0, 6.0])
    beats: list[datetime] = []

    def last_tick(outcome: ProjectOutcome) -> None:
        beats.append(chessboard_recalc_counters(db_engine).last_tick_at)  # type: ignore[arg-type]

    drain_tick(db_engine, on_outcome=last_tick, clock=lambda: next(clock))
    # Started (and beat) at 0; 1 s later no write; past a tick (5 s) one more.
    assert beats[0] == beats[1] < beats[2]
    assert beats[0] > datetime.now(UTC) - timedelta(minutes=1)


def test_liveness_reads_the_databases_clock_not_the_daemons(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon clock 10 min ahead must not make a worker that just ticked look silent."""
    import pin_orchestration.assets.chessboard_health as health

    class Ahead(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def,override]
            return datetime.now(tz) + timedelta(minutes=10)

    add_recalc_request(db_engine, minutes_overdue=2)
    record_outcomes(db_engine, [])
    monkeypatch.setattr(health, "datetime", Ahead)
    assert alert_checks(db_url, monkeypatch)[LIVENESS]
