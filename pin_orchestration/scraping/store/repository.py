"""The jobs repository (seed 004's `jobs-repository`): intake — the one door into
scraping.jobs, whatever the caller (POST /jobs, POST /jobs/batch, the CLI) — and the
tenants' queries of their jobs.

The scraping.* tables are read and written from store/ — this module, tenancy.py (tenants,
API keys, weights), politeness.py (hosts' limits and pauses) and leases.py (claimed jobs'
leases, outcomes, sweeps, requeues) — and by modules that own one concern's named queries
from end to end: worker/run.py (the claim), worker/wait_reasons.py (why a job waits),
fetch/robots.py (scraping.robots), webhooks/deliveries.py (webhook deliveries) and
metrics.py (the gauges); api/cache.py only LISTENs for finished jobs.

Functions take a SQLAlchemy Connection when the caller owns the transaction, an Engine
when the function is a unit of work of its own.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from pin_orchestration.platform.ids import uuid7s
from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.fetch import hosts

# How long an Idempotency-Key is remembered (documented in the API and docs/jobs/scraping.md).
IDEMPOTENCY_KEY_TTL_SECONDS = 24 * 3600
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

log = logging.getLogger(__name__)


_q = NamedQueries("pin_orchestration.scraping", "queries.sql")


PRIORITIES = ("high", "normal", "low")
MAX_IDEMPOTENCY_KEY_LENGTH = 255


@dataclass(frozen=True)
class JobRequest:
    url: str
    params: Mapping[str, Any]
    priority: str = "normal"
    callback_url: str | None = None
    # its fetch's timeout (None: the service's); set after the insert, see set_job_timeouts
    timeout_seconds: float | None = None

    @property
    def domain(self) -> str:
        """The host key of its URL (hosts.check_url: memoized, so the API's validation
        already paid for it)."""
        return hosts.check_url(self.url, "url")

    def bind(self) -> dict[str, Any]:
        """The request as the parameters of the intake's named queries."""
        return {
            "url": self.url,
            "params": json.dumps(self.params),
            "priority": self.priority,
            "callback_url": self.callback_url,
        }


@dataclass(frozen=True)
class Submitted:
    id: uuid.UUID
    status: str
    replayed: bool  # an earlier request with the same Idempotency-Key made this job


class IdempotencyKeyReused(Exception):
    """The Idempotency-Key was used before with a different request body. `position`: the
    job of the batch that reused it (its place in the list submitted)."""

    def __init__(self, key: str | None, position: int = 0) -> None:
        super().__init__(key)
        self.key = key
        self.position = position


class JobRejected(ValueError):
    """A job refused at intake; the message names the field (as scraping.submit_job's
    SQLSTATE 22023 names the argument)."""


def check_job(request: JobRequest, idempotency_key: str | None) -> None:
    """What the API's models check of a job, for the Python callers: the same URL rules
    (hosts.check_url), a priority, a JSON object of params, a key PostgreSQL can store.
    JobRejected naming the field."""
    try:
        hosts.check_url(request.url, "url")
        if request.callback_url is not None:
            hosts.check_url(request.callback_url, "callback_url")
    except ValueError as exc:
        raise JobRejected(str(exc)) from None
    if request.priority not in PRIORITIES:
        raise JobRejected(f"priority must be high, normal or low (got {request.priority!r})")
    if not isinstance(request.params, Mapping):
        raise JobRejected("params must be a JSON object")
    if idempotency_key is not None:
        problem = idempotency_key_problem(idempotency_key)
        if problem:
            raise JobRejected(f"idempotency_key {problem}")


def idempotency_key_problem(key: str) -> str | None:
    """Why PostgreSQL could not keep `key` as an Idempotency-Key, or None."""
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH:
        return f"must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters (got {len(key)})"
    if "\x00" in key:
        return "must not contain NUL characters"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (such as \\ud800), which is not text"
    return None


def submit_job(
    engine: Engine, tenant_id: uuid.UUID, request: JobRequest, idempotency_key: str | None
) -> Submitted:
    """Accept a job (SCR-1, SCR-4) by the intake path every door of the API takes: checked
    as POST /jobs checks it (JobRejected naming the field), its domain keyed as the fetcher
    resolves its host, its fair tag and domain queue given, a repeated Idempotency-Key
    answered with the first job."""
    check_job(request, idempotency_key)
    with engine.begin() as conn:
        return insert_job(conn, tenant_id, request, idempotency_key)


def insert_job(
    conn: Connection, tenant_id: uuid.UUID, request: JobRequest, idempotency_key: str | None
) -> Submitted:
    """One checked job in the caller's transaction: submit_jobs' statement with one job
    (IdempotencyKeyReused raised)."""
    answer = submit_jobs(conn, tenant_id, [(request, idempotency_key)], atomic=True)[0]
    assert isinstance(answer, Submitted)  # atomic: a reused key is raised
    return answer


def submit_jobs(
    conn: Connection,
    tenant_id: uuid.UUID,
    requests: Sequence[tuple[JobRequest, str | None]],
    *,
    atomic: bool,
) -> list[Submitted | IdempotencyKeyReused]:
    """Accept checked jobs (the API's models or check_job checked them) in the caller's
    transaction, in three statements whatever their number: one statement per job costs
    ~0.6 ms, 400 of them far more than a batch's 100 ms. The same Idempotency-Key rules as
    scraping.submit_job. A reused key is that job's answer (the others are stored), or
    with `atomic` raised, naming the job: the caller's transaction then rolls every job
    back."""
    ids = uuid7s(len(requests))
    rows = [
        {
            "ord": n,
            "id": str(ids[n]),
            "url": request.url,
            "domain": request.domain,
            "params": request.params,
            "priority": request.priority,
            "callback_url": request.callback_url,
            "idempotency_key": idempotency_key,
        }
        for n, (request, idempotency_key) in enumerate(requests)
    ]
    keys = sorted({r["idempotency_key"] for r in rows if r["idempotency_key"] is not None})
    if keys:
        conn.execute(
            _q("forget_expired_idempotency_keys"),
            {"tenant_id": tenant_id, "keys": keys, "ttl_seconds": IDEMPOTENCY_KEY_TTL_SECONDS},
        )
    keyed_inserted = set(
        conn.execute(
            _q("insert_jobs"), {"tenant_id": tenant_id, "jobs": json.dumps(rows)}
        ).scalar_one()
    )
    inserted = [
        row["idempotency_key"] is None or job_id in keyed_inserted
        for job_id, row in zip(ids, rows, strict=True)
    ]
    _set_timeouts(
        conn,
        [
            (job_id, request.timeout_seconds)
            for job_id, (request, _), new in zip(ids, requests, inserted, strict=True)
            if new
        ],
    )
    missing = [n for n, new in enumerate(inserted) if not new]
    existing = {}
    if missing:
        existing = {
            r.ord: r
            for r in conn.execute(
                _q("jobs_by_idempotency_keys"),
                {"tenant_id": tenant_id, "jobs": json.dumps(rows), "ords": missing},
            )
        }
    answers: list[Submitted | IdempotencyKeyReused] = []
    for job_id, row, new in zip(ids, rows, inserted, strict=True):
        if new:
            answers.append(Submitted(job_id, "queued", False))
            continue
        # Not inserted: its key is taken, by an earlier request or an earlier job here.
        winner = existing[row["ord"]]
        if not winner.same_body:
            reused = IdempotencyKeyReused(row["idempotency_key"], row["ord"])
            if atomic:
                raise reused
            answers.append(reused)
        else:
            answers.append(Submitted(winner.id, winner.status, replayed=True))
    return answers


def _set_timeouts(conn: Connection, jobs: Sequence[tuple[uuid.UUID, float | None]]) -> None:
    """The jobs' own fetch timeouts, in the intake's transaction: a statement only when a
    job asks for one (scraping.submit_job and insert_jobs keep their columns: a job row
    without it takes the service's timeout). A replayed job keeps the timeout it had: the
    update matches the new row only (`timeout_seconds IS NULL`)."""
    given = [(str(job_id), seconds) for job_id, seconds in jobs if seconds is not None]
    if given:
        conn.execute(
            _q("set_job_timeouts"),
            {"ids": [i for i, _ in given], "seconds": [s for _, s in given]},
        )


@dataclass(frozen=True)
class IntakeLimit:
    """The per-tenant intake rate limit of POST /jobs (PIN_SCRAPING_INTAKE_RPS / _BURST)."""

    rps: float
    burst: int

    @property
    def enabled(self) -> bool:
        return self.rps > 0


@dataclass(frozen=True)
class IntakeTaken:
    wait_seconds: float  # 0.0: taken, go on; otherwise the seconds until there are enough
    remaining: float  # the tokens left in the bucket (after the take, or beside a refusal)


def take_intake_token(
    conn: Connection, tenant_id: uuid.UUID, limit: IntakeLimit, jobs: int = 1
) -> IntakeTaken:
    """Take one intake token per job from the tenant's bucket, shared by every API process
    (one statement); all of them or none. Taken in the caller's transaction: the bucket's
    row stays locked, for the tenant's other requests, until it ends."""
    row = conn.execute(
        _q("take_intake_token"),
        {"tenant_id": tenant_id, "rps": limit.rps, "burst": limit.burst, "jobs": jobs},
    ).one()
    if row.taken is not None:
        return IntakeTaken(0.0, max(row.taken, 0.0))
    # The level read beside a refusal: a concurrent take may have moved it since, so the
    # wait is a floor; a client told too short a wait is simply refused again.
    level = row.level if row.level is not None else 0.0
    return IntakeTaken(max((jobs - level) / limit.rps, 0.001), max(level, 0.0))


def give_back_intake_tokens(
    conn: Connection, tenant_id: uuid.UUID, limit: IntakeLimit, jobs: int
) -> None:
    """Return tokens take_intake_token took in this transaction for jobs not stored."""
    conn.execute(
        _q("give_back_intake_tokens"),
        {"tenant_id": tenant_id, "burst": limit.burst, "jobs": jobs},
    )


def replayed_job(
    conn: Connection, tenant_id: uuid.UUID, request: JobRequest, idempotency_key: str
) -> Submitted | None:
    """The job an earlier request with this Idempotency-Key made, while the key is
    remembered; IdempotencyKeyReused when that request had another body. Lets the intake
    limiter answer a repeat as intake would, without spending a token on it."""
    row = conn.execute(
        _q("remembered_job_by_idempotency_key"),
        {
            "tenant_id": tenant_id,
            "idempotency_key": idempotency_key,
            "ttl_seconds": IDEMPOTENCY_KEY_TTL_SECONDS,
            **request.bind(),
        },
    ).one_or_none()
    if row is None:
        return None
    if not row.same_body:
        raise IdempotencyKeyReused(idempotency_key)
    return Submitted(row.id, row.status, replayed=True)


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
