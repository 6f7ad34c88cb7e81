"""Jobs of the scraping service with what launches them: the worker run and
`scraping_jobs_sensor`, the webhook delivery run and `scraping_webhooks_sensor`, the lease
sweeper and its every-minute schedule `scraping_stuck_sweeper`, and the runbook's requeue
of failed jobs. Each op calls its domain entry point (`scraping.worker.run.run_worker`,
`scraping.webhooks.deliveries.run_deliveries`, `scraping.store.leases`), which runs the
named queries of `scraping/queries.sql` / `scraping/webhooks.sql`.

The sensors never launch one run per scraping job: a worker run drains many jobs,
PIN_SCRAPING_SLOTS at once. A live worker run claims new due jobs within its poll interval,
so `scraping_jobs_sensor` only adds runs when the claimable backlog is more than the live
runs' slots can take, or when claimable jobs have waited longer than a sensor interval (the
live runs are full). It sizes by what could be claimed now, never by all that is due: jobs
whose domains are paused or at their concurrency would only start runs that claim nothing
and exit idle. Never by CPU: a worker run spends its time waiting on targets."""
# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at definition time.

import math
import uuid

from dagster import (
    AssetMaterialization,
    Config,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Failure,
    OpExecutionContext,
    ScheduleDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    in_process_executor,
    job,
    op,
    sensor,
)
from pydantic import Field

from pin_orchestration.assets.scraping import SCRAPING_RESULTS, WORKER_JOB
from pin_orchestration.coordination.cancellation import stop_requested_on_signals
from pin_orchestration.jobs.drain_runs import drain_run_requests, runs_in_flight
from pin_orchestration.platform.options import dagster_config
from pin_orchestration.platform.settings import SettingsError
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.scraping import ScrapingResource
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.webhooks.deliveries import run_deliveries, webhook_stats
from pin_orchestration.scraping.webhooks.options import DeliveryOptions, WebhookConfigError
from pin_orchestration.scraping.worker.options import (
    WORKER_RUN_OPTIONS,
    WorkerConfigError,
    WorkerOptions,
)
from pin_orchestration.scraping.worker.run import run_worker

# dagster.yaml caps concurrent runs per value of this tag.
WORKER_TAGS = {"pin/drain": "scraping-worker"}
WEBHOOK_DELIVERY_JOB = "scraping_webhook_delivery"
WEBHOOK_DELIVERY_TAGS = {"pin/drain": "scraping-webhooks"}
SENSOR_INTERVAL_SECONDS = 5


WorkerRunConfig = dagster_config(WorkerOptions, "WorkerRunConfig", names=WORKER_RUN_OPTIONS)


@op(
    description="Claim due scraping jobs with a lease, fetch them in bounded slots, store "
    "the bodies, record outcomes; one materialization of scraping/results per day written.",
)
def drain_scraping_jobs(
    context: OpExecutionContext,
    config: WorkerRunConfig,  # type: ignore[valid-type]
    database: DatabaseResource,
    scraping: ScrapingResource,
) -> None:
    try:
        settings = scraping.get_settings()
        options = WorkerOptions(
            slots=config.slots if config.slots is not None else settings.slots,
            lease_seconds=settings.lease_seconds,
            idle_exit_seconds=config.idle_exit_seconds,
            max_run_duration_seconds=config.max_run_duration_seconds,
            domain_rps=settings.domain_rps,
            domain_concurrency=settings.domain_concurrency,
            robots=settings.robots,
            robots_retry_seconds=settings.robots_retry_seconds,
        )
        options.validate()
    except (SettingsError, WorkerConfigError) as exc:
        raise Failure(description=str(exc)) from exc
    fetcher = scraping.get_fetcher(settings)
    try:
        with stop_requested_on_signals(reraise=True) as stop:
            report = run_worker(
                database.get_engine(),
                scraping.get_result_store(settings),
                fetcher,
                scraping.get_retry_policy(settings),
                options,
                worker_id=f"run-{context.run.run_id}",
                stop=stop,
            )
    finally:
        fetcher.close()
    for day, written in sorted(report.by_day.items()):
        context.log_event(
            AssetMaterialization(
                asset_key=SCRAPING_RESULTS,
                partition=day.isoformat(),
                metadata={
                    "jobs_stored": written.jobs_stored,
                    "bytes": written.bytes,
                    "failures_by_class": dict(written.failures_by_class),
                    "worker": report.worker,
                },
            )
        )
    context.log.info(
        f"worker {report.worker}: claimed {report.claimed}, succeeded {report.succeeded}, "
        f"retried {report.retried}, failed {report.failed}, cancelled {report.cancelled}, "
        f"lease lost {report.lease_lost}, peak in flight {report.peak_in_flight}"
    )


@job(
    name=WORKER_JOB,
    executor_def=in_process_executor,
    tags=WORKER_TAGS,
    description="A scraping worker run (SPEC §4): drains many jobs; launched by "
    "scraping_jobs_sensor, never one run per job.",
)
def scraping_worker() -> None:
    drain_scraping_jobs()


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


@op
def sweep_expired_scraping_leases(
    context: OpExecutionContext, database: DatabaseResource, scraping: ScrapingResource
) -> None:
    """Jobs whose worker stopped renewing its lease go back to queued (SCR-5)."""
    swept = leases.sweep_expired_leases(
        database.get_engine(), max_attempts=scraping.get_settings().max_attempts
    )
    for row in swept:
        context.log.warning(f"lease expired: job {row.id} attempt {row.attempts} → {row.status}")
    context.log.info(f"swept {len(swept)} job(s) with an expired lease")


@job(name="scraping_sweep_expired_leases", executor_def=in_process_executor)
def scraping_sweep_expired_leases() -> None:
    sweep_expired_scraping_leases()


scraping_stuck_sweeper = ScheduleDefinition(
    name="scraping_stuck_sweeper",
    job=scraping_sweep_expired_leases,
    cron_schedule="* * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Every minute: running jobs whose lease expired go back to queued (SCR-5).",
)


class RequeueConfig(Config):
    job_ids: list[str] = Field(description="Ids (uuid) of failed scraping jobs to run again")


@op
def requeue_failed_scraping_jobs(
    context: OpExecutionContext, config: RequeueConfig, database: DatabaseResource
) -> None:
    """Runbook: failed jobs back to queued with a fresh attempt budget."""
    try:
        ids = [uuid.UUID(i) for i in config.job_ids]
    except ValueError as exc:
        raise Failure(description=f"job_ids: every item must be a uuid ({exc})") from exc
    requeued = set(leases.requeue_failed_jobs(database.get_engine(), ids))
    skipped = [str(i) for i in ids if i not in requeued]
    context.log.info(f"requeued {len(requeued)} job(s)")
    if skipped:
        raise Failure(description=f"not failed (or unknown), left as they are: {skipped}")


@job(name="scraping_requeue", executor_def=in_process_executor)
def scraping_requeue() -> None:
    requeue_failed_scraping_jobs()


WebhookDeliveryConfig = dagster_config(
    DeliveryOptions, "WebhookDeliveryConfig", "Batching and duration of a webhook delivery run"
)


@op(
    description="Deliver due completion webhooks (signed POSTs through the SSRF guard), "
    "recording every attempt; retries back off, capped at PIN_WEBHOOK_MAX_ATTEMPTS.",
)
def deliver_scraping_webhooks(
    context: OpExecutionContext,
    config: WebhookDeliveryConfig,  # type: ignore[valid-type]
    database: DatabaseResource,
    scraping: ScrapingResource,
) -> None:
    try:
        settings = scraping.get_settings()
        options: DeliveryOptions = config.to_options()  # type: ignore[attr-defined]
        policy = scraping.get_webhook_policy(settings)
        options.validate()
        policy.validate()
    except (SettingsError, WebhookConfigError) as exc:
        raise Failure(description=str(exc)) from exc
    with (
        scraping.get_webhook_fetcher(settings) as fetcher,
        stop_requested_on_signals(reraise=True) as stop,
    ):
        report = run_deliveries(database.get_engine(), fetcher, policy, options, stop=stop)
    context.log.info(
        f"webhooks: claimed {report.claimed}, delivered {report.delivered}, retried "
        f"{report.retried}, gave up {report.gave_up}, errors {report.by_error_class}"
    )
    if report.gave_up:
        context.log.warning(
            f"{report.gave_up} webhook(s) given up: see GET /jobs/{{id}}/deliveries"
        )


@job(
    name=WEBHOOK_DELIVERY_JOB,
    executor_def=in_process_executor,
    tags=WEBHOOK_DELIVERY_TAGS,
    description="Deliver completion webhooks of finished scraping jobs (SCR-11); launched "
    "by scraping_webhooks_sensor, each run drains many deliveries.",
)
def scraping_webhook_delivery() -> None:
    deliver_scraping_webhooks()


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
