from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from dagster import build_schedule_context

from pin_orchestration.definitions import build_definitions
from pin_orchestration.schedules.news import news_comment_reconcile_daily
from pin_orchestration.settings import Settings

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
