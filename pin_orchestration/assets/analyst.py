"""The analysts' derived assets, one per area, materialized by automation as soon as their
upstream partition is (sensor `pin_analyst_automation`, sensors/analyst.py), lineage shown
in the asset graph."""

from datetime import timedelta
from typing import Any

import pandas as pd
from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AutomationCondition,
    BackfillPolicy,
    FreshnessPolicy,
    asset,
)

from pin_orchestration.analyst import (
    BUILDING_FREE_SHARE_SCHEMA,
    DRIFT_BY_STATUS_SCHEMA,
    SCRAPING_OUTCOMES_SCHEMA,
    building_free_share,
    drift_by_post_status,
    scraping_outcomes,
)
from pin_orchestration.assets.chessboard import PROJECT_AGGREGATES, chessboard_projects
from pin_orchestration.assets.news_reconcile import (
    DAILY_RECONCILE_FRESHNESS,
    POST_COMMENT_COUNTS,
    news_daily_partitions,
)
from pin_orchestration.assets.scraping import RESULT_DAYS, SCRAPING_RESULTS
from pin_orchestration.resources.analyst_io import column_schema
from pin_orchestration.resources.database import DatabaseResource

DRIFT_BY_POST_STATUS = AssetKey(["news", "daily_drift_by_post_status"])
BUILDING_FREE_SHARE = AssetKey(["chessboard", "building_free_share"])
SCRAPING_DAILY_OUTCOMES = AssetKey(["scraping", "daily_outcomes"])

# eager() without its latest-day restriction: a backfilled or re-run past day gets its
# derived partition too, which is what an analyst comparing days needs. Never from an
# upstream partition whose blocking check failed on its latest materialization: the frame
# would republish what the check found false (a newer materialization, e.g. a drain's
# recalc, clears that, as it clears the check's status in the UI).
FOLLOW_UPSTREAM = AutomationCondition.eager().without(
    AutomationCondition.in_latest_time_window()
) & ~AutomationCondition.any_deps_match(
    AutomationCondition.any_checks_match(AutomationCondition.check_failed(), blocking_only=True)
).with_label("no_dep_failed_a_blocking_check")

# Worker runs materialize scraping/results as they store results, not on a schedule, and
# this frame follows within a minute: built at least once in any 25 h (a day with no
# scraping at all also shows here, as late).
SCRAPING_DAY_FRESHNESS = FreshnessPolicy.time_window(fail_window=timedelta(hours=25))


@asset(
    key=DRIFT_BY_POST_STATUS,
    ins={"runs": AssetIn(POST_COMMENT_COUNTS)},
    partitions_def=news_daily_partitions,
    automation_condition=FOLLOW_UPSTREAM,
    freshness_policy=DAILY_RECONCILE_FRESHNESS,
    io_manager_key="pin_frames",
    metadata=column_schema(DRIFT_BY_STATUS_SCHEMA),
    group_name="news",
    kinds={"pandas"},
    description="Per day and post status: posts the reconcile corrected and the total "
    "change of their comments_count (negative: the counter had run ahead).",
)
def daily_drift_by_post_status(
    context: AssetExecutionContext, runs: pd.DataFrame, database: DatabaseResource
) -> pd.DataFrame:
    return drift_by_post_status(database.get_engine(), runs, context.partition_key)


# A drain recalculates projects by the dozen (the seed has 2,000), and automation requests
# all their frames at once: as a backfill, which without a policy launches one run per
# project (seconds of CPU each). A single-run policy makes that one run
# per stretch of projects adjacent in the partitions' order (their registration order;
# Dagster 1.13 runs a key range, so projects apart in that order still get a run each, see
# tests/test_analyst.py). The daily frames keep one run per day: their upstream days
# arrive one at a time, and a day that fails to build must not fail its neighbours.
@asset(
    key=BUILDING_FREE_SHARE,
    ins={"aggregates": AssetIn(PROJECT_AGGREGATES)},
    partitions_def=chessboard_projects,
    automation_condition=FOLLOW_UPSTREAM,
    backfill_policy=BackfillPolicy.single_run(),
    io_manager_key="pin_frames",
    metadata=column_schema(BUILDING_FREE_SHARE_SCHEMA),
    group_name="chessboard",
    kinds={"pandas"},
    description="Per project and building: free property objects as a share of all.",
)
def project_building_free_share(context: AssetExecutionContext, aggregates: Any) -> Any:
    """A project's frame from its aggregates; in a run of several projects, the IO managers
    pass and take {project id: frame} (resources/analyst_io.py): hence `Any`, which Dagster
    does not type-check, for a DataFrame or such a dict."""
    if len(context.partition_keys) == 1:
        return building_free_share(aggregates)
    return {project: building_free_share(frame) for project, frame in aggregates.items()}


@asset(
    key=SCRAPING_DAILY_OUTCOMES,
    ins={"jobs": AssetIn(SCRAPING_RESULTS)},
    partitions_def=RESULT_DAYS,
    automation_condition=FOLLOW_UPSTREAM,
    freshness_policy=SCRAPING_DAY_FRESHNESS,
    io_manager_key="pin_frames",
    metadata=column_schema(SCRAPING_OUTCOMES_SCHEMA),
    group_name="scraping",
    kinds={"pandas"},
    description="Per UTC day, tenant, target domain and status: jobs, attempts and the "
    "median seconds from acceptance to finish.",
)
def scraping_daily_outcomes(jobs: pd.DataFrame) -> pd.DataFrame:
    return scraping_outcomes(jobs)
