"""Today is a partition of every time-partitioned asset: what ran today is visible and
loadable while the day is still running, not only after midnight."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from dagster import DagsterInstance
from sqlalchemy import Engine

from pin_orchestration.assets.analyst import SCRAPING_DAILY_OUTCOMES
from pin_orchestration.assets.news_reconcile import POST_COMMENT_COUNTS
from pin_orchestration.assets.scraping import SCRAPING_RESULTS
from pin_orchestration.definitions import build_definitions
from tests.test_analyst import add_scraping_job


def partitions_of(key) -> object:
    return build_definitions().resolve_assets_def(key).partitions_def


def test_the_current_day_is_the_last_partition_of_each_daily_asset() -> None:
    utc_today = datetime.now(UTC).date().isoformat()
    moscow_today = datetime.now(ZoneInfo("Europe/Moscow")).date().isoformat()
    assert partitions_of(SCRAPING_RESULTS).get_last_partition_key() == utc_today
    assert partitions_of(SCRAPING_DAILY_OUTCOMES).get_last_partition_key() == utc_today
    # A reconcile launched today (FullSweep on demand) records its run under today's
    # Moscow day, the partition an analyst then loads.
    assert partitions_of(POST_COMMENT_COUNTS).get_last_partition_key() == moscow_today


def test_todays_scraping_results_load_while_the_day_runs(
    db_url: str, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    now = datetime.now(UTC)
    job = add_scraping_job(db_engine, now.isoformat())
    with DagsterInstance.ephemeral() as instance:
        frame = build_definitions().load_asset_value(
            SCRAPING_RESULTS.path, partition_key=now.date().isoformat(), instance=instance
        )
    assert list(frame["job_id"].astype(str)) == [str(job)]
