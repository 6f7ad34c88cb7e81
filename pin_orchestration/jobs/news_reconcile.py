"""Jobs of news-comment-reconcile: the asset job the schedules launch and its alert checks."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job, in_process_executor

from pin_orchestration.assets.news_reconcile import POST_COMMENT_COUNTS, RECONCILE_HEALTH

news_comment_reconcile_job = define_asset_job(
    "news_comment_reconcile",
    selection=AssetSelection.assets(POST_COMMENT_COUNTS),
    executor_def=in_process_executor,
    tags={"pin/job": "news-comment-reconcile"},
    description="Reconcile news.posts.comments_count (seed 000). Config: scope, batch_size, "
    "max_run_duration_seconds, window_lookback_hours, lock_ttl_seconds, drift_alert_threshold",
)

news_comment_reconcile_health_job = define_asset_job(
    "news_comment_reconcile_health",
    # The health asset observed, then its checks (selected with it).
    selection=AssetSelection.assets(RECONCILE_HEALTH),
    executor_def=in_process_executor,
    description="Alert checks: a successful reconcile within 26 h, no failed runs",
)
