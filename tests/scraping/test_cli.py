"""`pin tenant …` and `pin scraping …` run as an operator would: real subprocesses, real
PostgreSQL."""

from __future__ import annotations

import json
import time
import uuid

from sqlalchemy import Engine, text

from pin_orchestration.scraping.store import leases, repository, tenancy
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.worker.run import claim_due_jobs
from tests.scraping.conftest import UNLIMITED
from tests.test_cli import pin


def test_tenant_create_prints_the_key_once_and_stores_only_its_hash(
    db_url: str, db_engine: Engine
) -> None:
    created = pin("tenant", "create", "shop", "--json", url=db_url)
    assert created.returncode == 0, created.stderr
    answer = json.loads(created.stdout)
    assert answer["name"] == "shop" and uuid.UUID(answer["id"])
    key = answer["api_key"]
    with db_engine.connect() as conn:
        assert tenancy.tenant_for_api_key(conn, key).name == "shop"
        stored = conn.execute(text("SELECT * FROM scraping.tenants")).one()._mapping
    assert key not in json.dumps({k: str(v) for k, v in stored.items()})

    again = pin("tenant", "create", "shop", url=db_url)
    assert again.returncode != 0 and "exists already" in again.stderr
    bad = pin("tenant", "create", "no spaces please", url=db_url)
    assert bad.returncode != 0 and "tenant name" in bad.stderr

    listed = pin("tenant", "list", url=db_url)
    assert listed.returncode == 0 and listed.stdout.startswith("shop\t")
    assert key not in listed.stdout


def test_rotate_key_ends_the_old_key_at_once(db_url: str, db_engine: Engine) -> None:
    old = json.loads(pin("tenant", "create", "shop", "--json", url=db_url).stdout)["api_key"]
    rotated = pin("tenant", "rotate-key", "shop", "--json", url=db_url)
    assert rotated.returncode == 0, rotated.stderr
    new = json.loads(rotated.stdout)["api_key"]
    with db_engine.connect() as conn:
        assert tenancy.tenant_for_api_key(conn, old) is None
        assert tenancy.tenant_for_api_key(conn, new).name == "shop"
    unknown = pin("tenant", "rotate-key", "nobody", url=db_url)
    assert unknown.returncode != 0 and "no tenant 'nobody'" in unknown.stderr


def test_failed_jobs_are_listed_and_requeued(db_url: str, db_engine: Engine, make_tenant) -> None:
    tenant, _ = make_tenant("shop")
    job_id = repository.submit_job(
        db_engine, tenant.id, JobRequest(url="http://127.0.0.1:9/x", params={}), None
    ).id
    claim_due_jobs(db_engine, worker="dead", limit=1, lease_seconds=0.01, domain_defaults=UNLIMITED)
    time.sleep(0.05)
    leases.sweep_expired_leases(db_engine, max_attempts=1)

    failed = pin("scraping", "failed", url=db_url)
    assert failed.returncode == 0 and str(job_id) in failed.stdout
    assert "lease_expired" in failed.stdout
    requeued = pin("scraping", "requeue", str(job_id), url=db_url)
    assert requeued.returncode == 0 and "requeued" in requeued.stdout
    with db_engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT status FROM scraping.jobs WHERE id = :id"), {"id": job_id}
            ).scalar()
            == "queued"
        )
    again = pin("scraping", "requeue", str(job_id), "not-a-uuid", url=db_url)
    assert again.returncode != 0


def test_domain_list_with_nothing_to_list_says_so_and_gives_the_defaults(db_url: str) -> None:
    listed = pin("scraping", "domain", "list", url=db_url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == (
        "no domain has an override, a pause, or queued or running jobs: every host gets "
        "the defaults, 2 rps and 4 concurrent (PIN_SCRAPING_DOMAIN_RPS, "
        "PIN_SCRAPING_DOMAIN_CONCURRENCY; overrides: pin scraping domain set HOST)\n"
    )


def test_pin_scraping_work_runs_a_worker_without_loading_dagster(db_url: str) -> None:
    """The fault suite, cron and an operator's shell start workers by the dozen; a worker
    outside Dagster has no use for Dagster's import (a second of CPU each)."""
    worked = pin(
        "scraping",
        "work",
        "--idle-exit-seconds",
        "0.1",
        url=db_url,
        python_args=["-X", "importtime"],
    )
    assert worked.returncode == 0, worked.stderr[-3000:]
    assert json.loads(worked.stdout)["claimed"] == 0
    imported = [line.rsplit("|", 1)[-1].strip() for line in worked.stderr.splitlines()]
    dagster = [name for name in imported if name.split(".")[0] == "dagster"]
    assert dagster == [], f"pin scraping work imported {dagster[:5]}"
