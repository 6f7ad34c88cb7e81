"""Jobs of news-comment-reconcile: the asset job the schedules launch and its alert checks."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job, in_process_executor

from pin_orchestration.assets.news_reconcile import (
    POST_COMMENT_COUNTS,
    no_failed_runs_in_26h,
    reconciled_within_26h,
)

news_comment_reconcile_job = define_asset_job(
    "news_comment_reconcile",
    selection=AssetSelection.assets(POST_COMMENT_COUNTS).without_checks()
    | AssetSelection.checks_for_assets(POST_COMMENT_COUNTS)
    - AssetSelection.checks(reconciled_within_26h, no_failed_runs_in_26h),
    executor_def=in_process_executor,
    tags={"pin/job": "news-comment-reconcile"},
    description="Reconcile news.posts.comments_count (seed 000). Config: scope, batch_size, "
    "max_run_duration_seconds, window_lookback_hours, lock_ttl_seconds, drift_alert_threshold",
)

news_comment_reconcile_health_job = define_asset_job(
    "news_comment_reconcile_health",
    selection=AssetSelection.checks(reconciled_within_26h, no_failed_runs_in_26h),
    executor_def=in_process_executor,
    description="Alert checks: a successful reconcile within 26 h, no failed runs",
)
