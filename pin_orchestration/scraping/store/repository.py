"""The jobs repository: the only module that reads and writes scraping.* tables (seed 004's
`jobs-repository`). The API, the worker runs and the CLI go through it.

Functions take a SQLAlchemy Connection when the caller owns the transaction, an Engine
when the function is a unit of work of its own.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from pin_orchestration.platform.ids import uuid7, uuid7s
from pin_orchestration.platform.sql import load_queries
from pin_orchestration.scraping.fetch import hosts

# How long an Idempotency-Key is remembered (documented in the API and docs/jobs/scraping.md).
IDEMPOTENCY_KEY_TTL_SECONDS = 24 * 3600
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

log = logging.getLogger(__name__)


@functools.cache
def _q(name: str) -> Any:
    # One TextClause per query: building one parses its bind parameters anew.
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
    """The tenant whose key this is. Only the key's sha256 is ever compared, never the key:
    the index lookup's timing can tell an attacker at most how many leading bytes of a
    *digest* matched, which does not help find a key whose digest matches more (a
    preimage); the final comparison is constant-time all the same."""
    digest = api_key_digest(api_key)
    row = conn.execute(_q("tenant_by_key"), {"api_key_sha256": digest}).one_or_none()
    if row is None or not hmac.compare_digest(bytes(row.api_key_sha256), digest):
        return None
    return Tenant(row.id, row.name)


def tenant_by_name(conn: Connection, name: str) -> Tenant | None:
    row = conn.execute(_q("tenant_by_name"), {"name": name}).one_or_none()
    return Tenant(row.id, row.name) if row else None


MAX_TENANT_WEIGHT = 1000.0


def set_tenant_weight(engine: Engine, name: str, weight: float) -> Tenant:
    """A tenant's share of the picks inside each priority class (default 1: a tenant of
    weight 2 starts twice as many jobs as one of weight 1 while both have work)."""
    if not 0 < weight <= MAX_TENANT_WEIGHT:
        raise TenantError(f"weight must be > 0 and <= {MAX_TENANT_WEIGHT} (got {weight})")
    with engine.begin() as conn:
        row = conn.execute(_q("set_tenant_weight"), {"name": name, "weight": weight}).one_or_none()
    if row is None:
        raise TenantError(f"no tenant {name!r} (pin tenant list shows them)")
    return Tenant(row.id, row.name)


# --- domains ---------------------------------------------------------------------------


def normalize_host(host: str) -> str:
    """A host an operator names (`pin scraping domain …`) as the politeness limits key it:
    hosts.host_key, the key intake gives a job's URL. DomainError saying why."""
    try:
        return hosts.host_key(host.strip(), "the host")
    except ValueError as exc:
        raise DomainError(str(exc)) from None


class DomainError(ValueError):
    """A domain command that cannot be carried out (bad host, bad limit)."""


# An empty bucket gets a token back within 100 s (the claim relies on it).
MIN_DOMAIN_RPS = 0.01
MAX_DOMAIN_RPS = 10_000.0
MAX_DOMAIN_CONCURRENCY = 10_000


def set_domain_limits(
    engine: Engine, host: str, *, rps: float | None, concurrency: int | None
) -> dict[str, Any]:
    """Override a domain's requests per second and/or concurrent connections (what is not
    given stays as it is); every worker obeys it from its next claim."""
    domain = normalize_host(host)
    if rps is not None and not MIN_DOMAIN_RPS <= rps <= MAX_DOMAIN_RPS:
        raise DomainError(
            f"--rps must be between {MIN_DOMAIN_RPS:g} and {MAX_DOMAIN_RPS:g} (got {rps})"
        )
    if concurrency is not None and not 0 < concurrency <= MAX_DOMAIN_CONCURRENCY:
        raise DomainError(
            f"--concurrency must be > 0 and <= {MAX_DOMAIN_CONCURRENCY} (got {concurrency})"
        )
    if rps is None and concurrency is None:
        raise DomainError("give --rps and/or --concurrency")
    with engine.begin() as conn:
        row = conn.execute(
            _q("set_domain_limits"), {"domain": domain, "rps": rps, "concurrency": concurrency}
        ).one()
    return dict(row._mapping)


def clear_domain_limits(engine: Engine, host: str) -> bool:
    """Back to the defaults; False when the domain had no row."""
    domain = normalize_host(host)
    with engine.begin() as conn:
        return conn.execute(_q("clear_domain_limits"), {"domain": domain}).one_or_none() is not None


def pause_domain(
    engine: Engine, host: str, *, seconds: float, max_pause_seconds: float
) -> datetime:
    """Pause a domain for every worker (what a 429 does), through scraping.pause_domain:
    capped at `max_pause_seconds`; a longer pause in force stands. Returns the pause kept."""
    if not seconds > 0:
        raise DomainError(f"--for must be a duration > 0 (got {seconds:g} s)")
    domain = normalize_host(host)
    with engine.begin() as conn:
        conn.execute(_q("set_max_pause"), {"seconds": max_pause_seconds})
        # a job's wait says the host is paused by an operator (scraping/worker/wait_reasons.py)
        conn.execute(_q("set_pause_cause"))
        return conn.execute(_q("pause_domain"), {"domain": domain, "seconds": seconds}).scalar_one()


def resume_domain(engine: Engine, host: str) -> bool:
    """Lift a domain's pause at once; False when none was in force."""
    domain = normalize_host(host)
    with engine.begin() as conn:
        return bool(conn.execute(_q("resume_domain"), {"domain": domain}).one().was_paused)


def list_domains(engine: Engine) -> list[dict[str, Any]]:
    """Domains with an override, a pause in force, or queued or running jobs."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(_q("list_domains"))]


# --- intake and queries ----------------------------------------------------------------


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


# --- worker side -----------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedJob:
    id: uuid.UUID
    tenant_id: uuid.UUID
    url: str
    params: dict[str, Any]
    attempt: int  # this attempt's number (attempts ever started)
    budget_used: int  # attempts since the last requeue, this one included, robots waits not
    created_at: datetime
    domain: str
    priority: str
    timeout_seconds: float | None = None  # its fetch's; None: the service's
    # When the claim took it (PostgreSQL's time), and the host's turn with it.
    claimed_at: datetime | None = None


@dataclass(frozen=True)
class DomainDefaults:
    """The limits of a domain without an override (PIN_SCRAPING_DOMAIN_RPS /
    PIN_SCRAPING_DOMAIN_CONCURRENCY)."""

    rps: float
    concurrency: int


@dataclass(frozen=True)
class QueueStats:
    due: int
    queued: int
    next_due_at: datetime | None
    oldest_due_age_seconds: float
    # Due jobs a worker could claim now (domains not paused, below their concurrency, each
    # counted up to its free connections and its bucket's tokens) and how long the oldest
    # of them has waited.
    claimable: int
    oldest_claimable_age_seconds: float


def queue_stats(conn: Connection, domain_defaults: DomainDefaults) -> QueueStats:
    row = conn.execute(
        _q("queue_stats"),
        {
            "default_concurrency": domain_defaults.concurrency,
            "default_rps": domain_defaults.rps,
        },
    ).one()
    return QueueStats(
        due=row.due,
        queued=row.queued,
        next_due_at=row.next_due_at,
        oldest_due_age_seconds=float(row.oldest_due_age_seconds or 0.0),
        claimable=int(row.claimable),
        oldest_claimable_age_seconds=float(row.oldest_claimable_age_seconds or 0.0),
    )


@contextlib.contextmanager
def _autocommit(engine: Engine) -> Iterator[Connection]:
    """A connection whose every statement is its own transaction, committed by the server
    as the statement ends."""
    with engine.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


class RedirectSlots:
    """A claimed job's redirect hops against their own hosts' limits (fetch.RedirectSlots),
    through scraping.take_redirect_slot / release_redirect_slot: each call is one short
    transaction of its own."""

    def __init__(
        self,
        engine: Engine,
        job: ClaimedJob,
        *,
        hold_seconds: float,
        domain_defaults: DomainDefaults,
    ) -> None:
        self._engine = engine
        self._job = job
        self._hold_seconds = hold_seconds
        self._defaults = domain_defaults
        self._holds = False

    def take(self, host: str) -> float:
        # The last hop's slot goes back in a transaction of its own: released inside the
        # take, its domain's queue rows would be locked before the next hop's domain row,
        # in whatever order the hops come, not in domain order as everywhere else.
        self.release()
        # One statement, its own transaction: committed as it ends, so the host's row lock
        # it takes is not held over a COMMIT's round trip (answered late by a worker busy
        # with its hundreds of slot threads, while every turn and claim of the host waits).
        with _autocommit(self._engine) as conn:
            wait = conn.execute(
                _q("take_redirect_slot"),
                {
                    "job_id": self._job.id,
                    "attempt": self._job.attempt,
                    "host": host,
                    "hold_seconds": self._hold_seconds,
                    "default_rps": self._defaults.rps,
                    "default_concurrency": self._defaults.concurrency,
                },
            ).scalar_one()
        self._holds = True  # a hop to the job's own domain holds nothing: a no-op release
        return float(wait)

    def release(self) -> None:
        """Give back the last hop's slot. Never raises: it runs as the fetch ends, and a
        database unreachable then must not throw away the answer in hand (the attempt
        became a worker_error and the page was fetched again); a slot not given back
        lapses by itself at its row's expiry, the fetch's deadline."""
        if not self._holds:
            return
        try:
            with _autocommit(self._engine) as conn:
                conn.execute(
                    _q("release_redirect_slot"),
                    {"job_id": self._job.id, "attempt": self._job.attempt},
                )
        except Exception:
            log.warning(
                "redirect slot of job %s not given back (it lapses at the fetch deadline)",
                self._job.id,
                exc_info=True,
            )
            return
        self._holds = False


def renew_leases(
    engine: Engine,
    *,
    worker: str,
    attempts: Iterable[tuple[uuid.UUID, int]],
    lease_seconds: float,
) -> dict[tuple[uuid.UUID, int], bool]:
    """(job id, attempt) → cancel requested, for the attempts whose lease this worker
    still holds (the job running that very attempt, under this worker)."""
    pairs = list(attempts)
    if not pairs:
        return {}
    with engine.begin() as conn:
        rows = conn.execute(
            _q("renew_leases"),
            {
                "ids": [str(j) for j, _ in pairs],
                "numbers": [n for _, n in pairs],
                "worker": worker,
                "lease_seconds": lease_seconds,
            },
        ).all()
    return {(r.id, r.attempts): r.cancel_requested for r in rows}


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
    # The domain that answered (the job's, or a redirect hop's), and when it asked to be
    # left alone (a 429, a Retry-After): every worker leaves that domain alone until then.
    domain: str | None = None
    domain_paused_until: datetime | None = None
    # The job's own domain: a round's writes lock domains in its order (finish_attempts).
    job_domain: str | None = None
    # When next_attempt_at and domain_paused_until were decided: the deciding clock's
    # reading and time.monotonic() beside it. The write turns those moments into delays
    # from this reading, less the (monotonic) time since: a worker clock stepped between
    # the decision and the write moves nothing. Without them, the write's clock is used.
    decided_at: datetime | None = None
    decided_monotonic: float | None = None
    # The attempt only waited on its host's robots.txt (robots_pending, robots_unreachable):
    # nothing was sent to the job's URL, and its budget is not spent (scraping.jobs.robots_waits).
    robots_wait: bool = False


def finish_attempts(
    engine: Engine,
    *,
    worker: str,
    outcomes: Sequence[AttemptOutcome],
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    max_pause_seconds: float | None = None,
) -> dict[uuid.UUID, str]:
    """Write a round of outcomes in one transaction; returns the jobs actually written with
    the status each now has — `cancelled` where a cancel was requested while the attempt
    ran, whatever the outcome said (a job whose lease this worker lost is left to its new
    owner, and missing).

    Retry and pause times were decided with the worker's `clock`; they are written as
    delays from PostgreSQL's now(), the clock every claim compares with, so a worker host
    whose clock is off does not move them by its skew (the fault suite's clock jump). The
    delay is measured from the outcome's own decision (`decided_at`, less the monotonic
    time since), so a clock stepped between the decision and this write moves nothing
    either (stepped an hour ahead, a 429's 120 s was written as due at once)."""
    if not outcomes:
        return {}

    written_at, written_monotonic = clock(), time.monotonic()

    def seconds_from_now(o: AttemptOutcome, moment: datetime | None) -> float | None:
        if moment is None:
            return None
        if o.decided_at is None or o.decided_monotonic is None:
            return (moment - written_at).total_seconds()
        since = max(written_monotonic - o.decided_monotonic, 0.0)
        return (moment - o.decided_at).total_seconds() - since

    pauses: dict[str, float] = {}
    for o in outcomes:
        paused_for = seconds_from_now(o, o.domain_paused_until)
        if o.domain and paused_for is not None:
            pauses[o.domain] = max(paused_for, pauses.get(o.domain, paused_for))
    # Each write locks rows of one domain (the job's queue rows through the triggers, the
    # domain's row and queues for a pause), held to the commit. Written in completion order,
    # two rounds met in opposite orders and deadlocked; in domain order (a domain's
    # outcomes, then its pause), as the sweeper and the requeue lock them, they queue.
    by_domain: dict[str, list[AttemptOutcome]] = {}
    for o in sorted(outcomes, key=lambda o: str(o.job_id)):
        by_domain.setdefault(o.job_domain or "", []).append(o)
    written: dict[uuid.UUID, str] = {}
    with engine.begin() as conn:
        # A retry takes its tenant's next fair tag before its domain's queue is touched:
        # those rows first, in one order (two rounds whose tenants crossed deadlocked).
        _lock_fair_tag_rows(conn, [o.job_id for o in outcomes if o.status == "queued"])
        if pauses and max_pause_seconds is not None:
            conn.execute(_q("set_max_pause"), {"seconds": max_pause_seconds})
        for domain in sorted(by_domain.keys() | pauses.keys()):
            for o in by_domain.get(domain, []):
                written.update(_finish_attempt(conn, worker, o, seconds_from_now))
            if domain in pauses:
                conn.execute(
                    _q("pause_domains"),
                    {"domains": [domain], "paused_for": [pauses[domain]]},
                )
    return written


def _finish_attempt(
    conn: Connection,
    worker: str,
    o: AttemptOutcome,
    seconds_from_now: Callable[[AttemptOutcome, datetime | None], float | None],
) -> dict[uuid.UUID, str]:
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
            "next_attempt_in": seconds_from_now(o, o.next_attempt_at),
            "robots_wait": o.robots_wait,
            "result_key": o.result_key,
            "result_size": o.result_size,
            "result_sha256": o.result_sha256,
            "result_content_type": o.result_content_type,
        },
    ).one_or_none()
    return {} if row is None else {o.job_id: row.status}


def attempts_written(
    engine: Engine, attempts: Sequence[tuple[uuid.UUID, int]]
) -> dict[tuple[uuid.UUID, int], str]:
    """(job id, attempt) → the job's status, for those of `attempts` whose outcome is
    written (by the finish whose acknowledgement the caller may have missed)."""
    if not attempts:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(
            _q("attempts_written"),
            {"job_ids": [str(j) for j, _ in attempts], "numbers": [n for _, n in attempts]},
        ).all()
    return {(r.job_id, r.number): r.status for r in rows}


def sweep_expired_leases(engine: Engine, *, max_attempts: int, limit: int = 1000) -> list[Any]:
    """Return expired-lease jobs to the queue (SCR-5); rows of the jobs swept. Their
    fair-tag rows, then their domains' queue rows, are locked first, each in one order
    (lock_fair_tag_rows, lock_domain_queues). Redirect slots past their hold (a worker
    killed mid-hop) are deleted too, in a transaction of their own."""
    with engine.begin() as conn:
        expired = conn.execute(_q("expired_lease_jobs"), {"limit": limit}).all()
        _lock_fair_tag_rows(conn, [r.id for r in expired])
        _lock_domain_queues(conn, sorted({r.domain for r in expired}))
        swept = conn.execute(
            _q("sweep_expired_leases"), {"max_attempts": max_attempts, "limit": limit}
        ).all()
    with engine.begin() as conn:
        conn.execute(_q("delete_lapsed_redirect_slots"), {"limit": limit})
    return swept


def list_failed_jobs(engine: Engine, limit: int = 100) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(_q("list_failed_jobs"), {"limit": limit})]


def requeue_failed_jobs(engine: Engine, job_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Runbook: failed jobs back to queued with a fresh attempt budget; others untouched.
    Their fair-tag rows, then their domains' queue rows, are locked first, each in one
    order (lock_fair_tag_rows, lock_domain_queues)."""
    ids = [str(i) for i in job_ids]
    with engine.begin() as conn:
        _lock_fair_tag_rows(conn, ids)
        domains = conn.execute(_q("failed_job_domains"), {"ids": ids}).scalars().all()
        _lock_domain_queues(conn, domains)
        rows = conn.execute(_q("requeue_failed_jobs"), {"ids": ids}).all()
    return [r.id for r in rows]


def _lock_fair_tag_rows(conn: Connection, job_ids: Sequence[uuid.UUID | str]) -> None:
    if job_ids:
        conn.execute(_q("lock_fair_tag_rows"), {"ids": [str(i) for i in job_ids]}).all()


def _lock_domain_queues(conn: Connection, domains: Sequence[str]) -> None:
    if domains:
        conn.execute(_q("lock_domain_queues"), {"domains": sorted(domains)}).all()
