"""Jobs of the scraping service: the worker run, the webhook delivery run, the lease
sweeper and the runbook's requeue of failed jobs (their sensors are in sensors/scraping.py,
the sweeper's schedule in schedules/scraping.py). Each op calls its domain entry point
(`scraping.worker.run.run_worker`, `scraping.webhooks.deliveries.run_deliveries`,
`scraping.store.leases`), which runs the named queries of `scraping/queries.sql` /
`scraping/webhooks.sql`.

A worker run drains many scraping jobs, PIN_SCRAPING_SLOTS at once; a delivery run drains
every due webhook."""
# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at definition time.

import uuid

from dagster import (
    AssetMaterialization,
    Config,
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from pin_orchestration.assets.scraping import SCRAPING_RESULTS, WORKER_JOB
from pin_orchestration.coordination.cancellation import stop_requested_on_signals
from pin_orchestration.coordination.job_identity import JobIdentity
from pin_orchestration.platform.options import dagster_config
from pin_orchestration.platform.settings import SettingsError
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.scraping import ScrapingResource
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.webhooks.deliveries import run_deliveries
from pin_orchestration.scraping.webhooks.options import DeliveryOptions, WebhookConfigError
from pin_orchestration.scraping.worker.options import (
    WORKER_RUN_OPTIONS,
    WorkerConfigError,
    WorkerOptions,
)
from pin_orchestration.scraping.worker.run import run_worker

# dagster.yaml caps concurrent runs per value of this tag.
WORKER_TAGS = {"pin/drain": "scraping-worker"}
WEBHOOK_DELIVERY_JOB = JobIdentity("scraping_webhook_delivery", records_runs=False)
WEBHOOK_DELIVERY_TAGS = {"pin/drain": "scraping-webhooks"}


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
    name=WORKER_JOB.name,
    executor_def=in_process_executor,
    tags=WORKER_TAGS,
    description="A scraping worker run (SPEC §4): drains many jobs; launched by "
    "scraping_jobs_sensor, never one run per job.",
)
def scraping_worker() -> None:
    drain_scraping_jobs()


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
    name=WEBHOOK_DELIVERY_JOB.name,
    executor_def=in_process_executor,
    tags=WEBHOOK_DELIVERY_TAGS,
    description="Deliver completion webhooks of finished scraping jobs (SCR-11); launched "
    "by scraping_webhooks_sensor, each run drains many deliveries.",
)
def scraping_webhook_delivery() -> None:
    deliver_scraping_webhooks()
