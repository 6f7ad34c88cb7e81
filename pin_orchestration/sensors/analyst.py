"""`pin_analyst_automation`: materializes the analysts' derived assets (assets/analyst.py)
as soon as their upstream partitions are."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus

from pin_orchestration.assets.analyst import (
    BUILDING_FREE_SHARE,
    DRIFT_BY_POST_STATUS,
    SCRAPING_DAILY_OUTCOMES,
)

# Dagster's default automation sensor starts stopped; this one runs from the start so the
# derived assets follow their upstream without an operator switching anything on.
pin_analyst_automation = AutomationConditionSensorDefinition(
    name="pin_analyst_automation",
    target=AssetSelection.assets(
        DRIFT_BY_POST_STATUS, BUILDING_FREE_SHARE, SCRAPING_DAILY_OUTCOMES
    ),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    # Derived tables can wait: an operator's backfill or Launchpad run (priority 0) leaves
    # the queue first; dagster.yaml runs at most two of these at a time.
    run_tags={"dagster/priority": "-1"},
    description="Materializes the analysts' derived assets after their upstream partitions",
)
