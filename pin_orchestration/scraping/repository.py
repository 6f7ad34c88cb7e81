"""The jobs repository: the only module that reads and writes scraping.* tables (seed 004's
`jobs-repository`). The API, the worker runs and the CLI go through it.

Functions take a SQLAlchemy Connection when the caller owns the transaction, an Engine
when the function is a unit of work of its own.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from pin_orchestration.ids import uuid7
from pin_orchestration.sql import load_queries

# How long an Idempotency-Key is remembered (documented in the API and README).
IDEMPOTENCY_KEY_TTL_SECONDS = 24 * 3600
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def _q(name: str) -> Any:
    return text(load_queries("pin_orchestration.scraping", "queries.sql")[name])


# --- tenants -------------------------------------------------------------------------


@dataclass(frozen=True)
class Tenant:
    id: uuid.UUID
    name: str


class TenantError(ValueError):
    """A tenant command that cannot be carried out (name taken, unknown, malformed)."""


def _new_api_key() -> tuple[str, bytes, str]:
    key = "pin_" + secrets.token_urlsafe(32)
    return key, api_key_digest(key), key[:8]


def create_tenant(engine: Engine, name: str) -> tuple[Tenant, str]:
    """A new tenant and its API key — the only time the key is seen; only its hash is kept."""
    key, digest, prefix = _new_api_key()
    with engine.begin() as conn:
        try:
            row = conn.execute(
                _q("create_tenant"),
                {"id": uuid7(), "name": name, "api_key_sha256": digest, "api_key_prefix": prefix},
            ).one_or_none()
        except Exception as exc:  # the CHECK on the name
            if "tenants_name_check" in str(exc):
                raise TenantError(
                    f"tenant name {name!r} is invalid: use 1-63 letters, digits, '_', '.', '-'"
                ) from None
            raise
    if row is None:
        raise TenantError(f"tenant {name!r} exists already (rotate its key: pin tenant rotate-key)")
    return Tenant(row.id, row.name), key


def rotate_tenant_key(engine: Engine, name: str) -> tuple[Tenant, str]:
    key, digest, prefix = _new_api_key()
    with engine.begin() as conn:
        row = conn.execute(
            _q("rotate_tenant_key"),
            {"name": name, "api_key_sha256": digest, "api_key_prefix": prefix},
        ).one_or_none()
    if row is None:
        raise TenantError(f"no tenant {name!r} (pin tenant list shows them)")
    return Tenant(row.id, row.name), key


def list_tenants(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(_q("list_tenants"))]


def api_key_digest(api_key: str) -> bytes:
    """What is stored of a key (and what an API process remembers it by)."""
    return hashlib.sha256(api_key.encode()).digest()


def tenant_for_api_key(conn: Connection, api_key: str) -> Tenant | None:
    # The key has 256 bits of entropy: looking up its hash reveals nothing about other keys.
    digest = api_key_digest(api_key)
    row = conn.execute(_q("tenant_by_key"), {"api_key_sha256": digest}).one_or_none()
    return Tenant(row.id, row.name) if row else None


def tenant_by_name(conn: Connection, name: str) -> Tenant | None:
    row = conn.execute(_q("tenant_by_name"), {"name": name}).one_or_none()
    return Tenant(row.id, row.name) if row else None


# --- intake and queries ----------------------------------------------------------------


@dataclass(frozen=True)
class JobRequest:
    url: str
    params: Mapping[str, Any]
    priority: str = "normal"
    callback_url: str | None = None

    def sha256(self) -> str:
        canonical = json.dumps(
            {
                "url": self.url,
                "params": self.params,
                "priority": self.priority,
                "callback_url": self.callback_url,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Submitted:
    id: uuid.UUID
    status: str
    replayed: bool  # an earlier request with the same Idempotency-Key made this job


class IdempotencyKeyReused(Exception):
    """The Idempotency-Key was used before with a different request body."""


def submit_job(
    engine: Engine, tenant_id: uuid.UUID, request: JobRequest, idempotency_key: str | None
) -> Submitted:
    """Accept a job: one transaction, one row, nothing else touched (SCR-1, SCR-4)."""
    digest = request.sha256()
    insert = {
        "id": uuid7(),
        "tenant_id": tenant_id,
        "url": request.url,
        "params": json.dumps(request.params),
        "priority": request.priority,
        "callback_url": request.callback_url,
        "idempotency_key": idempotency_key,
        "request_sha256": digest,
    }
    if idempotency_key is None:
        # One statement is a transaction of its own: autocommit spares the BEGIN and COMMIT
        # round trips of intake's common case (bench/scraping_api.py).
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            row = conn.execute(_q("insert_job"), insert).one()
        return Submitted(row.id, row.status, replayed=False)
    with engine.begin() as conn:
        conn.execute(
            _q("forget_expired_idempotency_key"),
            {
                "tenant_id": tenant_id,
                "idempotency_key": idempotency_key,
                "ttl_seconds": IDEMPOTENCY_KEY_TTL_SECONDS,
            },
        )
        row = conn.execute(_q("insert_job"), insert).one_or_none()
        if row is not None:
            return Submitted(row.id, row.status, replayed=False)
        existing = conn.execute(
            _q("job_by_idempotency_key"),
            {"tenant_id": tenant_id, "idempotency_key": idempotency_key},
        ).one()
    if existing.request_sha256 != digest:
        raise IdempotencyKeyReused(idempotency_key)
    return Submitted(existing.id, existing.status, replayed=True)


def get_job(conn: Connection, tenant_id: uuid.UUID, job_id: uuid.UUID) -> dict[str, Any] | None:
    row = conn.execute(_q("get_job"), {"id": job_id, "tenant_id": tenant_id}).one_or_none()
    return dict(row._mapping) if row else None


def list_jobs(
    conn: Connection,
    tenant_id: uuid.UUID,
    *,
    status: str | None,
    limit: int,
    before_id: uuid.UUID | None,
) -> list[dict[str, Any]]:
    rows = conn.execute(
        _q("list_jobs"),
        {"tenant_id": tenant_id, "status": status, "limit": limit, "before_id": before_id},
    )
    return [dict(r._mapping) for r in rows]


def list_attempts(conn: Connection, job_id: uuid.UUID) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in conn.execute(_q("list_attempts"), {"job_id": job_id})]


def cancel_job(engine: Engine, tenant_id: uuid.UUID, job_id: uuid.UUID) -> tuple[str, bool] | None:
    """(status, changed): ('cancelled', True) when it was queued, ('running', True) when the
    worker was asked to stop, (terminal status, False) when it had finished already; None
    when the tenant has no such job."""
    with engine.begin() as conn:
        row = conn.execute(_q("cancel_job"), {"id": job_id, "tenant_id": tenant_id}).one_or_none()
        if row is not None:
            return row.status, True
        job = get_job(conn, tenant_id, job_id)
    return None if job is None else (job["status"], False)


# --- worker side -----------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedJob:
    id: uuid.UUID
    tenant_id: uuid.UUID
    url: str
    params: dict[str, Any]
    attempt: int  # this attempt's number (attempts ever started)
    budget_used: int  # attempts since the last requeue, this one included
    created_at: datetime


@dataclass(frozen=True)
class QueueStats:
    due: int
    queued: int
    next_due_at: datetime | None
    oldest_due_age_seconds: float


def queue_stats(conn: Connection) -> QueueStats:
    row = conn.execute(_q("queue_stats")).one()
    return QueueStats(
        due=row.due,
        queued=row.queued,
        next_due_at=row.next_due_at,
        oldest_due_age_seconds=float(row.oldest_due_age_seconds or 0.0),
    )


def claim_due_jobs(
    engine: Engine, *, worker: str, limit: int, lease_seconds: float
) -> list[ClaimedJob]:
    if limit <= 0:
        return []
    with engine.begin() as conn:
        rows = conn.execute(
            _q("claim_due_jobs"),
            {"worker": worker, "limit": limit, "lease_seconds": lease_seconds},
        ).all()
    return [
        ClaimedJob(
            id=r.id,
            tenant_id=r.tenant_id,
            url=r.url,
            params=r.params,
            attempt=r.attempts,
            budget_used=r.budget_used,
            created_at=r.created_at,
        )
        for r in rows
    ]


def renew_leases(
    engine: Engine, *, worker: str, job_ids: Iterable[uuid.UUID], lease_seconds: float
) -> dict[uuid.UUID, bool]:
    """Job id → cancel requested, for the jobs whose lease this worker still holds."""
    ids = [str(i) for i in job_ids]
    if not ids:
        return {}
    with engine.begin() as conn:
        rows = conn.execute(
            _q("renew_leases"), {"ids": ids, "worker": worker, "lease_seconds": lease_seconds}
        ).all()
    return {r.id: r.cancel_requested for r in rows}


@dataclass(frozen=True)
class AttemptOutcome:
    """What one attempt ended with, and the job's next state."""

    job_id: uuid.UUID
    attempt: int
    status: str  # the job's next status: queued | succeeded | failed | cancelled
    outcome: str  # the attempt's: retry | succeeded | failed | cancelled
    http_status: int | None = None
    error_class: str | None = None
    error_detail: str | None = None
    duration_ms: int | None = None
    next_attempt_at: datetime | None = None
    result_key: str | None = None
    result_size: int | None = None
    result_sha256: str | None = None
    result_content_type: str | None = None


def finish_attempts(
    engine: Engine, *, worker: str, outcomes: Sequence[AttemptOutcome]
) -> set[uuid.UUID]:
    """Write a round of outcomes in one transaction; returns the jobs actually written (a
    job whose lease this worker lost is left to its new owner)."""
    if not outcomes:
        return set()
    written: set[uuid.UUID] = set()
    with engine.begin() as conn:
        for o in outcomes:
            detail = o.error_detail[:512] if o.error_detail else None
            row = conn.execute(
                _q("finish_attempt"),
                {
                    "job_id": o.job_id,
                    "attempt": o.attempt,
                    "worker": worker,
                    "status": o.status,
                    "outcome": o.outcome,
                    "http_status": o.http_status,
                    "error_class": o.error_class,
                    "error_detail": detail,
                    "last_error": detail,
                    "duration_ms": o.duration_ms,
                    "next_attempt_at": o.next_attempt_at,
                    "result_key": o.result_key,
                    "result_size": o.result_size,
                    "result_sha256": o.result_sha256,
                    "result_content_type": o.result_content_type,
                },
            ).one_or_none()
            if row is not None:
                written.add(o.job_id)
    return written


def sweep_expired_leases(engine: Engine, *, max_attempts: int, limit: int = 1000) -> list[Any]:
    """Return expired-lease jobs to the queue (SCR-5); rows of the jobs swept."""
    with engine.begin() as conn:
        return conn.execute(
            _q("sweep_expired_leases"), {"max_attempts": max_attempts, "limit": limit}
        ).all()


def list_failed_jobs(engine: Engine, limit: int = 100) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(_q("list_failed_jobs"), {"limit": limit})]


def requeue_failed_jobs(engine: Engine, job_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Runbook: failed jobs back to queued with a fresh attempt budget; others untouched."""
    with engine.begin() as conn:
        rows = conn.execute(_q("requeue_failed_jobs"), {"ids": [str(i) for i in job_ids]}).all()
    return [r.id for r in rows]
