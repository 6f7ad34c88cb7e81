"""What every area hands the platform to serve — its Prometheus collectors, what
pin-retention needs of it — listed once, as definitions.py lists the areas' Dagster
definitions. platform/ and coordination/ take these as arguments and import no area
(tests/test_import_rules.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from pin_orchestration.chessboard.metrics import ChessboardRecalcCollector
from pin_orchestration.coordination.retention import RetentionRules
from pin_orchestration.news.metrics import ReconcileCollector
from pin_orchestration.news.snapshot_detach.monitoring import (
    LAG_BUCKETS_SECONDS,
    SnapshotDetachCollector,
)
from pin_orchestration.platform.metrics import build_registry
from pin_orchestration.scraping.metrics import ScrapingCollector
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store.local import result_store_from


def metric_collectors(engine: Engine) -> list[Collector]:
    """Every area's collector: what `pin metrics serve` and `pin up` expose."""
    return [
        ReconcileCollector(engine),
        SnapshotDetachCollector(engine),
        ChessboardRecalcCollector(engine),
        ScrapingCollector(engine),
    ]


def metrics_registry(engine: Engine) -> CollectorRegistry:
    """A registry of every area's collector (what /metrics serves)."""
    return build_registry(metric_collectors(engine))


def retention_rules() -> RetentionRules:
    """What pin-retention's statements read of the areas: the detach lag histogram's bounds
    (news_snapshot_detach_lag_seconds), the scraping results store and its default age —
    both from the environment, read when a run first needs them."""
    return RetentionRules(
        histogram_bounds={"lag_bounds": LAG_BUCKETS_SECONDS},
        result_store=lambda: result_store_from(ScrapingSettings.from_env()),
        scraping_results_days=lambda: ScrapingSettings.from_env().result_retention_days,
    )
