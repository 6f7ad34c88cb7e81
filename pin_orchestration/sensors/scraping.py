"""The scraping service's sensors: `scraping_jobs_sensor` launches `scraping_worker` runs,
`scraping_webhooks_sensor` launches `scraping_webhook_delivery` runs (jobs/scraping.py).

They never launch one run per scraping job: a worker run drains many jobs,
PIN_SCRAPING_SLOTS at once. A live worker run claims new due jobs within its poll interval,
so `scraping_jobs_sensor` only adds runs when the claimable backlog is more than the live
runs' slots can take, or when claimable jobs have waited longer than a sensor interval (the
live runs are full). It sizes by what could be claimed now (`leases.queue_stats`),
never by all that is due: jobs whose domains are paused or at their concurrency would only
start runs that claim nothing and exit idle. Never by CPU: a worker run spends its time
waiting on targets."""

import math

from dagster import DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from pin_orchestration.jobs.scraping import (
    WEBHOOK_DELIVERY_TAGS,
    WORKER_TAGS,
    scraping_webhook_delivery,
    scraping_worker,
)
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.scraping import ScrapingResource
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.webhooks.deliveries import webhook_stats
from pin_orchestration.sensors.drain_runs import drain_run_requests, runs_in_flight

SENSOR_INTERVAL_SECONDS = 5


def worker_runs_wanted(
    *,
    claimable: int,
    oldest_claimable_age_seconds: float,
    in_flight: int,
    slots: int,
    max_runs: int,
) -> int:
    """Runs to launch now: enough for the claimable backlog at `slots` each, one more when
    claimable jobs have waited past a sensor interval (live runs are full), within
    `max_runs`."""
    if claimable == 0:
        return 0
    target = math.ceil(claimable / slots)
    if in_flight > 0 and oldest_claimable_age_seconds > SENSOR_INTERVAL_SECONDS:
        target = max(target, in_flight + 1)
    return max(0, min(max_runs, target) - in_flight)


@sensor(
    name="scraping_jobs_sensor",
    job=scraping_worker,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description="Every 5 s: due scraping jobs → enough scraping_worker runs (each drains "
    "many jobs, PIN_SCRAPING_SLOTS at once) within PIN_SCRAPING_MAX_WORKER_RUNS.",
)
def scraping_jobs_sensor(
    context: SensorEvaluationContext, database: DatabaseResource, scraping: ScrapingResource
) -> SensorResult | SkipReason:
    settings = scraping.get_settings()
    with database.get_engine().connect() as conn:
        stats = leases.queue_stats(conn, settings.domain_defaults)
    if stats.due == 0:
        return SkipReason(f"no due scraping jobs ({stats.queued} queued)")
    if stats.claimable == 0:
        return SkipReason(
            f"{stats.due} due, none claimable now: their domains are paused or at their concurrency"
        )
    in_flight = runs_in_flight(context.instance, scraping_worker.name)
    wanted = worker_runs_wanted(
        claimable=stats.claimable,
        oldest_claimable_age_seconds=stats.oldest_claimable_age_seconds,
        in_flight=in_flight,
        slots=settings.slots,
        max_runs=settings.max_worker_runs,
    )
    if wanted == 0:
        return SkipReason(
            f"{stats.due} due ({stats.claimable} claimable), {in_flight} worker run(s) in flight"
        )
    tags = {**WORKER_TAGS, "pin/due_jobs": str(stats.due)}
    return drain_run_requests("scraping-worker", wanted, tags)


@sensor(
    name="scraping_webhooks_sensor",
    job=scraping_webhook_delivery,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description="Every 5 s: due completion webhooks → one scraping_webhook_delivery run "
    "(it drains them all), never one run per delivery.",
)
def scraping_webhooks_sensor(
    context: SensorEvaluationContext, database: DatabaseResource
) -> SensorResult | SkipReason:
    with database.get_engine().connect() as conn:
        stats = webhook_stats(conn)
    if stats.due == 0:
        return SkipReason(f"no due webhooks ({stats.pending} waiting for a retry)")
    if runs_in_flight(context.instance, scraping_webhook_delivery.name) > 0:
        return SkipReason(f"{stats.due} due, a delivery run is in flight")
    tags = {**WEBHOOK_DELIVERY_TAGS, "pin/due_webhooks": str(stats.due)}
    return drain_run_requests("scraping-webhooks", 1, tags, numbered=False)
