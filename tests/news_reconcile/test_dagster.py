"""The reconcile asset run by Dagster: materialization metadata, checks, skip and failure."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from dagster import DagsterInstance, Definitions, build_schedule_context, materialize
from sqlalchemy import Engine, text

from pin_orchestration.assets.news_reconcile import (
    DRIFT_CHECK,
    RECONCILE_HEALTH,
    comment_reconcile_health,
    no_failed_runs_in_26h,
    post_comment_counts,
    reconciled_within_26h,
)
from pin_orchestration.coordination.locks import try_acquire_lock
from pin_orchestration.definitions import build_definitions
from pin_orchestration.news import reconcile as reconcile_module
from pin_orchestration.news.reconcile import RECONCILE_JOB
from pin_orchestration.platform.settings import Settings
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.schedules.news_reconcile import (
    news_comment_reconcile_daily,
    news_comment_reconcile_health_job,
)
from tests.news_reconcile.factories import add_comments, add_post, comments_count

OP = "news__post_comment_counts"


def run_asset(
    db_url: str,
    config: dict | None = None,
    raise_on_error: bool = True,
    partition_key: str = "2026-11-29",
):
    return materialize(
        [post_comment_counts],
        partition_key=partition_key,
        resources={"database": DatabaseResource(url=db_url)},
        run_config={"ops": {OP: {"config": config or {"scope": "FullSweep"}}}},
        instance=DagsterInstance.ephemeral(),
        raise_on_error=raise_on_error,
    )


def test_materialization_corrects_drift_and_reports(db_url: str, db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=5)
    add_comments(db_engine, post, 3)
    result = run_asset(db_url)
    assert result.success
    assert comments_count(db_engine, post) == 3
    (mat,) = result.asset_materializations_for_node(OP)
    assert mat.partition == "2026-11-29"
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["drift_corrected"] == 1
    assert meta["posts_reconciled"] == 1
    assert meta["batches_processed"] == 1
    assert meta["backlog_remaining"] is False
    assert meta["last_post_id"] == str(post)
    assert "duration_ms" in meta
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == DRIFT_CHECK and check.passed


def test_drift_over_threshold_fails_the_drift_check(db_url: str, db_engine: Engine) -> None:
    for _ in range(3):
        add_post(db_engine, comments_count=1)
    result = run_asset(db_url, {"scope": "FullSweep", "drift_alert_threshold": 2})
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed
    assert check.metadata["drift_corrected"].value == 3


def test_lock_held_skips_successfully_without_materializing(db_url: str, db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=5)
    assert try_acquire_lock(db_engine, RECONCILE_JOB.lock_key, 600, "other-pod")
    result = run_asset(db_url)
    assert result.success
    assert result.asset_materializations_for_node(OP) == []
    assert comments_count(db_engine, post) == 5


def test_a_run_cancelled_by_sigterm_materializes_nothing(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster terminates a run with SIGTERM: the run stops after its batch, keeps what it
    committed, and its partition is not recorded as materialized."""
    posts = sorted(add_post(db_engine, comments_count=1) for _ in range(3))
    monkeypatch.setattr(reconcile_module, "SLICE_SECONDS", 0.0)  # a slice is one batch

    real_slice = reconcile_module.reconcile_slice
    sent: list[bool] = []

    def terminate_after_first_batch(*args: object, **kwargs: object):
        piece = real_slice(*args, **kwargs)  # type: ignore[arg-type]
        if piece.batches and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # as `dagster run terminate` does
        return piece

    monkeypatch.setattr(reconcile_module, "reconcile_slice", terminate_after_first_batch)
    result = run_asset(db_url, {"scope": "FullSweep", "batch_size": 1}, raise_on_error=False)
    assert sent
    assert not result.success
    assert result.asset_materializations_for_node(OP) == []
    # The batch before the stop stays committed.
    assert [comments_count(db_engine, p) for p in posts] == [0, 1, 1]


def test_invalid_config_fails_naming_the_field(db_url: str, db_engine: Engine) -> None:
    post = add_post(db_engine, comments_count=5)
    result = run_asset(db_url, {"scope": "FullSweep", "batch_size": 0}, raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0]
    assert "batch_size must be > 0" in failure.step_failure_data.error.message
    assert comments_count(db_engine, post) == 5


def test_failed_batch_fails_the_run(db_url: str, db_engine: Engine) -> None:
    add_post(db_engine, comments_count=5)
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION news.reject() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'disk on fire'; END $$;"
                "CREATE TRIGGER reject BEFORE UPDATE ON news.posts "
                "FOR EACH ROW EXECUTE FUNCTION news.reject();"
            )
        )
    result = run_asset(db_url, raise_on_error=False)
    assert not result.success
    assert "disk on fire" in result.get_step_failure_events()[0].step_failure_data.error.message


@pytest.mark.parametrize("age_hours, passed", [(None, False), (2, True), (30, False)])
def test_reconciled_within_26h_check(
    db_url: str, db_engine: Engine, age_hours: float | None, passed: bool
) -> None:
    if age_hours is not None:
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO pin.job_runs (job_code, run_id, status, started_at, finished_at) "
                    "VALUES ('news-comment-reconcile', 'r', 'succeeded', now(), "
                    "now() - make_interval(hours => :h))"
                ),
                {"h": age_hours},
            )
    defs = Definitions(
        assets=[post_comment_counts, comment_reconcile_health],
        asset_checks=[reconciled_within_26h, no_failed_runs_in_26h],
        resources={"database": DatabaseResource(url=db_url)},
    )
    job = Definitions.merge(defs, Definitions(jobs=[news_comment_reconcile_health_job]))
    outcome = job.resolve_job_def("news_comment_reconcile_health").execute_in_process(
        instance=DagsterInstance.ephemeral()
    )
    evaluations = {e.check_name: e for e in outcome.get_asset_check_evaluations()}
    assert evaluations["reconciled_within_26h"].passed is passed
    assert evaluations["no_failed_runs_in_26h"].passed
    assert all(e.asset_key == RECONCILE_HEALTH for e in evaluations.values())


def test_backfill_of_a_past_day_reconciles_that_days_activity(
    db_url: str, db_engine: Engine
) -> None:
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    msk = ZoneInfo("Europe/Moscow")
    ten_days_ago = datetime.now(msk) - timedelta(days=10)
    post = add_post(db_engine, comments_count=7)
    add_comments(db_engine, post, 2, at=ten_days_ago)

    yesterday = (datetime.now(msk) - timedelta(days=1)).date().isoformat()
    daily = {"scope": "DailyWindow"}
    assert run_asset(db_url, daily, partition_key=yesterday).success
    assert comments_count(db_engine, post) == 7  # quiet since: outside yesterday's window

    assert run_asset(db_url, daily, partition_key=ten_days_ago.date().isoformat()).success
    assert comments_count(db_engine, post) == 2


MSK = ZoneInfo("Europe/Moscow")


def test_daily_tick_reconciles_the_previous_moscow_day_in_daily_window() -> None:
    context = build_schedule_context(
        scheduled_execution_time=datetime(2026, 11, 30, 3, 0, tzinfo=MSK)
    )
    request = news_comment_reconcile_daily(context)
    assert request.partition_key == "2026-11-29"
    assert (
        request.run_config["ops"]["news__post_comment_counts"]["config"]["scope"] == "DailyWindow"
    )


def test_full_sweep_schedule_uses_the_configured_cron() -> None:
    settings = Settings.from_env({"PIN_NEWS_FULL_SWEEP_CRON": "0 5 * * 6"})
    repo = build_definitions(settings).get_repository_def()
    sweep = repo.get_schedule_def("news_comment_reconcile_full_sweep")
    assert sweep.cron_schedule == "0 5 * * 6"
    context = build_schedule_context(
        scheduled_execution_time=datetime(2026, 11, 28, 5, 0, tzinfo=MSK), repository_def=repo
    )
    request = sweep.evaluate_tick(context).run_requests[0]
    assert request.partition_key == "2026-11-27"
    assert request.run_config["ops"]["news__post_comment_counts"]["config"]["scope"] == "FullSweep"
