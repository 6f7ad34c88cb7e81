"""Dagster wiring of the scraping service: the sensor sizes worker runs from one query, a
worker run drains jobs and materializes scraping/results per day, the sweeper schedule
and the requeue runbook job — executed for real against PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC

import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_sensor_context,
)
from sqlalchemy import Engine, text

from pin_orchestration.assets.scraping import SCRAPING_RESULTS
from pin_orchestration.definitions import build_definitions
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.jobs.scraping import (
    WORKER_TAGS,
    scraping_requeue,
    scraping_sweep_expired_leases,
    scraping_worker,
)
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.scraping import ScrapingResource
from pin_orchestration.scraping.store import repository
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.worker.run import claim_due_jobs
from pin_orchestration.sensors.scraping import scraping_jobs_sensor, worker_runs_wanted
from tests.scraping.conftest import UNLIMITED
from tests.scraping.webhook_checks import assert_every_delivery_verifies


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def resources(db_url: str) -> dict:
    return {"database": DatabaseResource(url=db_url), "scraping": ScrapingResource()}


@pytest.fixture
def scraping_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PIN_HOME", str(tmp_path))
    monkeypatch.setenv("PIN_SCRAPING_ALLOWED_CIDRS", "127.0.0.1/32")
    monkeypatch.setenv("PIN_SCRAPING_SLOTS", "4")
    # The demo site is one host: its politeness limits are not what these tests look at.
    monkeypatch.setenv("PIN_SCRAPING_DOMAIN_RPS", "1000")
    monkeypatch.setenv("PIN_SCRAPING_DOMAIN_CONCURRENCY", "100")
    monkeypatch.delenv("PIN_S3_BUCKET", raising=False)


def submit(engine: Engine, tenant_id: uuid.UUID, url: str) -> uuid.UUID:
    return repository.submit_job(engine, tenant_id, JobRequest(url=url, params={}), None).id


def test_code_location_has_the_scraping_names() -> None:
    repo = build_definitions().get_repository_def()
    assert SCRAPING_RESULTS in repo.asset_graph.get_all_asset_keys()
    assert {"scraping_worker", "scraping_requeue"} <= {j.name for j in repo.get_all_jobs()}
    sweeper = repo.get_schedule_def("scraping_stuck_sweeper")
    assert (sweeper.cron_schedule, sweeper.default_status.value) == ("* * * * *", "RUNNING")
    assert repo.get_sensor_def("scraping_jobs_sensor").default_status.value == "RUNNING"
    partitions = repo.assets_defs_by_key[SCRAPING_RESULTS].partitions_def
    assert partitions.timezone == "UTC"


def test_runs_wanted_follow_the_backlog_within_the_cap() -> None:
    def wanted(claimable: int, age: float, in_flight: int) -> int:
        return worker_runs_wanted(
            claimable=claimable,
            oldest_claimable_age_seconds=age,
            in_flight=in_flight,
            slots=64,
            max_runs=4,
        )

    assert wanted(0, 0, 0) == 0
    assert wanted(1, 0, 0) == 1
    assert wanted(200, 0, 0) == 4
    assert wanted(200, 0, 2) == 2
    # a live run with room picks new jobs up itself
    assert wanted(10, 1, 1) == 0
    # but claimable jobs waiting past a sensor interval mean the live runs are full
    assert wanted(10, 30, 1) == 1
    assert wanted(10, 30, 4) == 0


def test_sensor_skips_an_empty_queue_and_launches_a_worker_run_when_due(
    instance, resources, db_engine: Engine, make_tenant, scraping_env
) -> None:
    context = build_sensor_context(instance=instance, resources=resources)
    assert isinstance(scraping_jobs_sensor(context), SkipReason)

    tenant, _ = make_tenant("shop")
    for i in range(9):
        submit(db_engine, tenant.id, f"http://127.0.0.1:9/{i}")
    result = scraping_jobs_sensor(build_sensor_context(instance=instance, resources=resources))
    assert isinstance(result, SensorResult)
    # 9 due jobs at 4 slots a run → 3 runs, within the default cap of 2
    assert len(result.run_requests) == 2
    assert all(r.tags["pin/drain"] == WORKER_TAGS["pin/drain"] for r in result.run_requests)
    assert len({r.run_key for r in result.run_requests}) == 2


def test_sensor_launches_no_run_for_due_jobs_that_no_worker_could_claim(
    instance, resources, db_engine: Engine, make_tenant, scraping_env
) -> None:
    tenant, _ = make_tenant("shop")
    for i in range(9):
        submit(db_engine, tenant.id, f"http://127.0.0.1:9/{i}")
    with db_engine.begin() as conn:  # the target answered 429, Retry-After: 60
        conn.execute(
            text("SELECT scraping.pause_domain('127.0.0.1', now() + interval '60 seconds')")
        )
    result = scraping_jobs_sensor(build_sensor_context(instance=instance, resources=resources))
    assert isinstance(result, SkipReason)
    assert "9 due, none claimable" in str(result.skip_message)


def test_a_worker_run_drains_jobs_and_materializes_the_day(
    instance, resources, db_engine: Engine, make_tenant, scraping_env
) -> None:
    site = ScrapingTarget().start()
    try:
        tenant, _ = make_tenant("shop")
        ok = [submit(db_engine, tenant.id, f"{site.url}/page/{i}") for i in range(5)]
        missing = submit(db_engine, tenant.id, f"{site.url}/missing/x")
        result = scraping_worker.execute_in_process(
            instance=instance,
            resources=resources,
            run_config={"ops": {"drain_scraping_jobs": {"config": {"idle_exit_seconds": 0.3}}}},
        )
    finally:
        site.stop()
    assert result.success
    with db_engine.connect() as conn:
        statuses = dict(conn.execute(text("SELECT id, status FROM scraping.jobs")).all())
    assert [statuses[i] for i in ok] == ["succeeded"] * 5
    assert statuses[missing] == "failed"
    [materialization] = [
        e.event_specific_data.materialization
        for e in result.all_events
        if e.event_type == DagsterEventType.ASSET_MATERIALIZATION
    ]
    assert materialization.asset_key == SCRAPING_RESULTS
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["jobs_stored"] == 5
    assert metadata["bytes"] > 0
    assert metadata["failures_by_class"] == {"http_404": 1}
    with db_engine.connect() as conn:
        day = conn.execute(text("SELECT min(created_at) FROM scraping.jobs")).scalar()
    assert materialization.partition == day.astimezone(UTC).date().isoformat()


def test_a_bad_setting_fails_the_run_naming_the_variable(
    instance, resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIN_SCRAPING_SLOTS", "lots")
    result = scraping_worker.execute_in_process(
        instance=instance, resources=resources, raise_on_error=False
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE)
    assert "PIN_SCRAPING_SLOTS" in str(failure.event_specific_data.error)


def test_sweeper_job_and_requeue_job(
    instance, resources, db_engine: Engine, make_tenant, scraping_env
) -> None:
    import time

    tenant, _ = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, "http://127.0.0.1:9/x")
    claim_due_jobs(db_engine, worker="dead", limit=1, lease_seconds=0.01, domain_defaults=UNLIMITED)
    time.sleep(0.05)
    assert scraping_sweep_expired_leases.execute_in_process(
        instance=instance, resources=resources
    ).success
    with db_engine.begin() as conn:
        assert (
            conn.execute(
                text("SELECT status FROM scraping.jobs WHERE id = :id"), {"id": job_id}
            ).scalar()
            == "queued"
        )
        conn.execute(text("UPDATE scraping.jobs SET status = 'failed', finished_at = now()"))
    requeued = scraping_requeue.execute_in_process(
        instance=instance,
        resources=resources,
        run_config={
            "ops": {"requeue_failed_scraping_jobs": {"config": {"job_ids": [str(job_id)]}}}
        },
    )
    assert requeued.success
    with db_engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT status FROM scraping.jobs WHERE id = :id"), {"id": job_id}
            ).scalar()
            == "queued"
        )


def test_webhooks_sensor_launches_one_delivery_run_that_drains_them_all(
    instance, resources, db_engine: Engine, make_tenant, scraping_env
) -> None:
    from pin_orchestration.jobs.scraping import WEBHOOK_DELIVERY_TAGS, scraping_webhook_delivery
    from pin_orchestration.sensors.scraping import scraping_webhooks_sensor
    from tests.scraping.test_webhooks import Receiver, finished_job

    repo = build_definitions().get_repository_def()
    assert repo.get_sensor_def("scraping_webhooks_sensor").default_status.value == "RUNNING"
    assert repo.has_job("scraping_webhook_delivery")
    context = build_sensor_context(instance=instance, resources=resources)
    assert isinstance(scraping_webhooks_sensor(context), SkipReason)

    receiver = Receiver()
    try:
        tenant, _ = make_tenant("shop")
        jobs = {finished_job(db_engine, tenant, receiver.url()) for _ in range(7)}
        result = scraping_webhooks_sensor(
            build_sensor_context(instance=instance, resources=resources)
        )
        assert isinstance(result, SensorResult)
        [request] = result.run_requests  # one run for all seven
        assert request.tags["pin/drain"] == WEBHOOK_DELIVERY_TAGS["pin/drain"]
        run = scraping_webhook_delivery.execute_in_process(
            instance=instance, resources=resources, tags=request.tags
        )
        assert run.success
        assert {uuid.UUID(e["id"]) for e in receiver.events()} == jobs
        assert_every_delivery_verifies(db_engine, receiver.received)
    finally:
        receiver.close()
    assert isinstance(
        scraping_webhooks_sensor(build_sensor_context(instance=instance, resources=resources)),
        SkipReason,
    )
