"""Retention of stored results (SCR-10) with a controllable clock (rows backdated): exactly
the expired objects are deleted, from moto S3 and from the local store, their jobs marked
expired, and the API answers 410 Gone for them instead of a dead URL."""

from __future__ import annotations

import hashlib
import io
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.areas import retention_rules
from pin_orchestration.coordination.retention import RetentionOptions, run_retention
from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.store.repository import JobRequest, submit_job
from pin_orchestration.scraping.store.results import ResultStore, result_key
from pin_orchestration.scraping.store.tenancy import Tenant
from tests.scraping.conftest import TEST_SETTINGS, auth

NOW = datetime.now(UTC)


def stored_job(
    engine: Engine, store: ResultStore, tenant: Tenant, finished_days_ago: float
) -> tuple[uuid.UUID, str]:
    """A succeeded job whose result is in the store, finished that many days before NOW."""
    job_id = submit_job(
        engine, tenant.id, JobRequest(url="http://127.0.0.1:9/x", params={}), None
    ).id
    finished = NOW - timedelta(days=finished_days_ago)
    key = result_key(tenant.id, job_id, finished, 1)
    body = f"result of {job_id}".encode()
    store.put(
        key,
        io.BytesIO(body),
        size=len(body),
        sha256=hashlib.sha256(body).hexdigest(),
        content_type="text/plain",
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET status = 'succeeded', attempts = 1, result_key = :key, "
                "result_size = :size, result_sha256 = :sha, result_content_type = 'text/plain', "
                "created_at = :at, started_at = :at, finished_at = :at WHERE id = :id"
            ),
            {
                "id": job_id,
                "key": key,
                "size": len(body),
                "sha": hashlib.sha256(body).hexdigest(),
                "at": finished,
            },
        )
    return job_id, key


def retain(engine: Engine, store: ResultStore, **options: object) -> object:
    return run_retention(
        engine,
        RetentionOptions(**options),  # type: ignore[arg-type]
        replace(retention_rules(), result_store=lambda: store),
        run_id="test",
        holder="test",
        now=NOW,
    )


@pytest.mark.parametrize("store_name", ["local_store", "s3_store"])
def test_exactly_the_expired_results_are_deleted_and_answer_410(
    request: pytest.FixtureRequest,
    store_name: str,
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
) -> None:
    store: ResultStore = request.getfixturevalue(store_name)
    tenant, key = make_tenant("acme")
    expired = [stored_job(db_engine, store, tenant, days) for days in (31, 45, 400)]
    kept = [stored_job(db_engine, store, tenant, days) for days in (29, 0)]

    result = retain(db_engine, store, scraping_results_days=30, batch_size=2)

    assert result.deleted["scraping_results"] == 3  # type: ignore[attr-defined]
    assert result.batches >= 2  # type: ignore[attr-defined]
    assert [store.head(k) for _, k in expired] == [None, None, None]
    assert all(store.head(k) is not None for _, k in kept)
    with TestClient(create_app(lambda: db_engine, store, TEST_SETTINGS)) as client:
        for job_id, _ in expired:
            answer = client.get(f"/jobs/{job_id}/result", headers=auth(key))
            assert answer.status_code == 410
            assert "deleted by retention" in answer.json()["detail"]
            # The job itself is still there.
            assert client.get(f"/jobs/{job_id}", headers=auth(key)).status_code == 200
        for job_id, _ in kept:
            assert client.get(f"/jobs/{job_id}/result", headers=auth(key)).status_code == 200

    # Nothing more is old enough: a second run deletes nothing.
    assert retain(db_engine, store, scraping_results_days=30).deleted["scraping_results"] == 0  # type: ignore[attr-defined]


def test_the_age_defaults_to_PIN_RESULT_RETENTION_DAYS(  # noqa: N802
    db_engine: Engine,
    local_store: ResultStore,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant, _ = make_tenant("acme")
    old = stored_job(db_engine, local_store, tenant, 31)
    middle = stored_job(db_engine, local_store, tenant, 12)
    young = stored_job(db_engine, local_store, tenant, 5)

    monkeypatch.delenv("PIN_RESULT_RETENTION_DAYS", raising=False)
    assert retain(db_engine, local_store).deleted["scraping_results"] == 1  # type: ignore[attr-defined]
    assert local_store.head(old[1]) is None and local_store.head(middle[1]) is not None

    monkeypatch.setenv("PIN_RESULT_RETENTION_DAYS", "10")
    assert retain(db_engine, local_store).deleted["scraping_results"] == 1  # type: ignore[attr-defined]
    assert local_store.head(middle[1]) is None and local_store.head(young[1]) is not None


def test_a_failing_store_marks_nothing(
    db_engine: Engine,
    local_store: ResultStore,
    make_tenant: Callable[[str], tuple[Tenant, str]],
) -> None:
    class Broken:
        def delete_many(self, keys: object) -> int:
            raise RuntimeError("the store is down")

    tenant, key = make_tenant("acme")
    job_id, object_key = stored_job(db_engine, local_store, tenant, 40)
    result = run_retention(
        db_engine,
        RetentionOptions(scraping_results_days=30),
        replace(retention_rules(), result_store=lambda: Broken()),
        run_id="test",
        holder="test",
        now=NOW,
    )
    assert result.status.value == "failed"
    with db_engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT result_expired_at FROM scraping.jobs WHERE id = :id"), {"id": job_id}
            ).scalar()
            is None
        )
    assert local_store.head(object_key) is not None


def test_objects_a_job_ended_without_are_deleted_and_its_result_kept(
    db_engine: Engine,
    local_store: ResultStore,
    make_tenant: Callable[[str], tuple[Tenant, str]],
) -> None:
    """What attempts left behind — a worker killed between its put and its finish, an
    attempt whose job then failed or was cancelled — goes once the job has been over for
    `scraping_attempt_objects_days`; the object the job reports stays."""
    tenant, _ = make_tenant("acme")

    def ended(status: str, attempts: int, stored: list[int], days_ago: float) -> list[str]:
        job_id = submit_job(
            db_engine, tenant.id, JobRequest(url="http://127.0.0.1:9/x", params={}), None
        ).id
        at = NOW - timedelta(days=days_ago)
        keys = [result_key(tenant.id, job_id, at, n) for n in stored]
        for key in keys:
            body = key.encode()
            local_store.put(
                key,
                io.BytesIO(body),
                size=len(body),
                sha256=hashlib.sha256(body).hexdigest(),
                content_type=None,
            )
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET status = :status, attempts = :attempts, "
                    "result_key = :result, created_at = :at, finished_at = :at WHERE id = :id"
                ),
                {
                    "id": job_id,
                    "status": status,
                    "attempts": attempts,
                    "at": at,
                    "result": keys[-1] if status == "succeeded" else None,
                },
            )
        return keys

    *orphan, result = ended("succeeded", 2, [1, 2], days_ago=3)
    failed = ended("failed", 3, [1, 3], days_ago=3)
    cancelled = ended("cancelled", 1, [1], days_ago=5)
    recent = ended("failed", 1, [1], days_ago=1)

    deleted = retain(db_engine, local_store, batch_size=2).deleted  # type: ignore[attr-defined]

    assert deleted["scraping_attempt_objects"] >= 4
    assert [local_store.head(k) for k in orphan + failed + cancelled] == [None] * 4
    assert local_store.head(result) is not None and local_store.head(recent[0]) is not None
    with db_engine.connect() as conn:
        unswept = conn.execute(
            text("SELECT count(*) FROM scraping.jobs WHERE attempt_objects_swept_at IS NULL")
        ).scalar_one()
    assert unswept == 1  # the recent one
    assert retain(db_engine, local_store).deleted["scraping_attempt_objects"] == 0  # type: ignore[attr-defined]
