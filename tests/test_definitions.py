"""Load the whole code location and pin down its names, crons and timezones.

An accidental rename of an asset, job, schedule or sensor breaks operators' bookmarks,
backfills and alert routing: it has to show up here, in review.
"""

from __future__ import annotations

from pathlib import Path

from pin_orchestration.definitions import build_definitions


def test_code_location_snapshot() -> None:
    repo = build_definitions().get_repository_def()
    assets = sorted(key.to_user_string() for key in repo.asset_graph.get_all_asset_keys())
    checks = sorted(
        f"{key.asset_key.to_user_string()}:{key.name}" for key in repo.asset_graph.asset_check_keys
    )
    jobs = sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__"))
    schedules = sorted(
        (s.name, s.cron_schedule, s.execution_timezone, s.default_status.value)
        for s in repo.schedule_defs
    )
    sensors = sorted((s.name, s.default_status.value) for s in repo.sensor_defs)

    assert "news/post_comment_counts" in assets
    assert {
        "news/post_comment_counts:drift_within_threshold",
        "news/comment_reconcile_health:reconciled_within_26h",
        "news/comment_reconcile_health:no_failed_runs_in_26h",
    } <= set(checks)
    assert {"news_comment_reconcile", "news_comment_reconcile_health"} <= set(jobs)
    assert {
        ("news_comment_reconcile_daily", "0 3 * * *", "Europe/Moscow", "RUNNING"),
        ("news_comment_reconcile_full_sweep", "0 4 * * 0", "Europe/Moscow", "RUNNING"),
        ("news_comment_reconcile_health_hourly", "17 * * * *", "Europe/Moscow", "RUNNING"),
    } <= set(schedules)
    # Issue 10: alerts on the asset pages, the analysts' derived assets, failed runs counted.
    # Issue 17/20: every alert on an unpartitioned health asset of its area (its state shows
    # on the checks tab), each seed alert a check.
    assert {"news/daily_drift_by_post_status", "chessboard/building_free_share"} <= set(assets)
    assert {
        "news/comment_reconcile_health",
        "chessboard/recalc_health",
        "scraping/jobs_health",
    } <= set(assets)
    assert {
        "chessboard/recalc_health:CHESSBOARD_RECALC_BACKLOG",
        "chessboard/recalc_health:no_poison_recalc_requests",
        "chessboard/recalc_health:process_p99_within_slo",
        "chessboard/recalc_health:recalc_errors_not_growing",
        "chessboard/recalc_health:recalc_worker_alive",
        "chessboard/recalc_health:no_failed_runs_in_1h",
        "scraping/jobs_health:scraping_queue_not_stalled",
        "scraping/jobs_health:no_jobs_past_lease",
        "scraping/jobs_health:jobs_start_within_a_minute",
        "scraping/jobs_health:jobs_terminal_without_a_human",
        "scraping/jobs_health:no_failed_runs_in_1h",
        "news/snapshot_detach_outbox:pending_not_growing",
        "news/snapshot_detach_outbox:no_failed_calls_spike",
        "news/snapshot_detach_outbox:no_failed_runs_in_1h",
    } <= set(checks)
    # Only checks judged per partition stay on partitioned assets.
    assert {c for c in checks if c.split(":")[0] in ("scraping/results",)} == set()
    assert "pin_alert_checks" in jobs
    assert ("pin_alert_checks_every_5_minutes", "*/5 * * * *", None, "RUNNING") in schedules
    assert {"record_failed_runs", "pin_analyst_automation"} <= {name for name, _ in sensors}
    assert all(status == "RUNNING" for _, status in sensors)


def test_reconcile_asset_is_daily_partitioned_in_moscow() -> None:
    repo = build_definitions().get_repository_def()
    asset = repo.assets_defs_by_key[
        next(k for k in repo.assets_defs_by_key if k.to_user_string() == "news/post_comment_counts")
    ]
    partitions = asset.partitions_def
    assert partitions.timezone == "Europe/Moscow"
    assert partitions.get_partition_keys()[0] == "2025-01-01"


def test_loading_the_module_reads_no_environment(monkeypatch) -> None:
    """The environment is read when Dagster builds the code location, not on import: a bad
    variable must not break `import pin_orchestration.definitions` (tests, tools)."""
    import importlib

    import pin_orchestration.definitions as module

    monkeypatch.setenv("PIN_NEWS_FULL_SWEEP_CRON", "not a cron")
    importlib.reload(module)
    from pin_orchestration.settings import SettingsError

    try:
        module.defs()
    except SettingsError as exc:
        assert "PIN_NEWS_FULL_SWEEP_CRON" in str(exc)
    else:
        raise AssertionError("a bad cron must be refused when the location is built")


def test_backfills_and_automation_runs_cost_one_process_and_yield_to_operators() -> None:
    """UI backfills and automation launch runs of the implicit asset job: in-process like
    the named jobs (one Python start per run, not one more per step), and the analysts'
    derived runs queue behind an operator's backfill, a few at a time (dagster.yaml)."""
    import yaml
    from dagster import in_process_executor

    from pin_orchestration.assets.analyst import pin_analyst_automation

    repo = build_definitions().get_repository_def()
    implicit = next(j for j in repo.get_all_jobs() if j.name.startswith("__ASSET_JOB"))
    assert implicit.executor_def is in_process_executor

    assert int(pin_analyst_automation.run_tags["dagster/priority"]) < 0
    limits = yaml.safe_load((Path(__file__).parent.parent / "dagster.yaml").read_text())[
        "concurrency"
    ]["runs"]["tag_concurrency_limits"]
    assert {"key": "dagster/sensor_name", "value": "pin_analyst_automation", "limit": 2} in limits
