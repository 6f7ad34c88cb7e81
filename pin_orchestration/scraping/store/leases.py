"""The worker side of scraping.jobs: a claimed job, its lease and its redirect hops' slots,
the outcomes of its attempts, the sweep of expired leases and the runbook's requeue, and the
queue's figures the sensor sizes worker runs by."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine

from pin_orchestration.platform.sql import NamedQueries

log = logging.getLogger(__name__)


_q = NamedQueries("pin_orchestration.scraping", "queries.sql")


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
def autocommit(engine: Engine) -> Iterator[Connection]:
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
        with autocommit(self._engine) as conn:
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
        # What is held now: nothing when the hop must wait (the earlier hop's slot went
        # back first), nor at the job's own domain (a token of it: the claim holds its
        # connection); then no release is owed, and none is sent.
        self._holds = wait == 0 and host != self._job.domain
        return float(wait)

    def release(self) -> None:
        """Give back the last hop's slot. Never raises: it runs as the fetch ends, and a
        database unreachable then must not throw away the answer in hand (the attempt
        became a worker_error and the page was fetched again); a slot not given back
        lapses by itself at its row's expiry, the fetch's deadline."""
        if not self._holds:
            return
        try:
            with autocommit(self._engine) as conn:
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
    # A pause is written first, each in a transaction of its own: the host is paused
    # before any job of it can be claimed again, and the tenant rows its trigger parks
    # are held only to that commit. Held to the round's, they sat outside the domain
    # order below: a batch intake holding a later domain's queue row and waiting for such
    # a tenant row deadlocked with the round. A pause only lengthens: a round written again
    # (the database lost midway) writes its pause again, ending where it did, or under
    # PIN_SCRAPING_MAX_PAUSE_SECONDS at most the cap from the second write (as a round
    # rolled back and written again did when the pause was in its transaction).
    for domain in sorted(pauses):
        with engine.begin() as conn:
            if max_pause_seconds is not None:
                conn.execute(_q("set_max_pause"), {"seconds": max_pause_seconds})
            conn.execute(_q("pause_domains"), {"domains": [domain], "paused_for": [pauses[domain]]})
    # Each write locks rows of one domain (the job's queue rows through the triggers),
    # held to the commit. Written in completion order, two rounds met in opposite orders
    # and deadlocked; in domain order, as the sweeper and the requeue lock them, they queue.
    by_domain: dict[str, list[AttemptOutcome]] = {}
    for o in sorted(outcomes, key=lambda o: str(o.job_id)):
        by_domain.setdefault(o.job_domain or "", []).append(o)
    written: dict[uuid.UUID, str] = {}
    handed_back = [o.job_id for o in outcomes if o.status == "queued"]
    if len(by_domain) == 1 and not handed_back:
        # The round is one statement, atomic by itself (the common round: one host's jobs
        # done): in autocommit, no BEGIN and COMMIT round trips of the worker's main loop,
        # each a wait for the GIL behind its slots as a round ends.
        [(_, ones)] = by_domain.items()
        with autocommit(engine) as conn:
            return _finish_attempts(conn, worker, ones, seconds_from_now)
    with engine.begin() as conn:
        # A retry takes its tenant's next fair tag before its domain's queue is touched:
        # those rows first, in one order (two rounds whose tenants crossed deadlocked).
        _lock_fair_tag_rows(conn, handed_back)
        for domain in sorted(by_domain):
            written.update(_finish_attempts(conn, worker, by_domain[domain], seconds_from_now))
    return written


def _finish_attempts(
    conn: Connection,
    worker: str,
    outcomes: Sequence[AttemptOutcome],
    seconds_from_now: Callable[[AttemptOutcome, datetime | None], float | None],
) -> dict[uuid.UUID, str]:
    """One domain's outcomes of a round in one statement (a statement per outcome cost a
    round trip and an execution each, ~1 per job, the most frequent of the worker's)."""
    details = [o.error_detail[:512] if o.error_detail else None for o in outcomes]
    rows = conn.execute(
        _q("finish_attempts"),
        {
            "worker": worker,
            "job_ids": [o.job_id for o in outcomes],
            "attempts": [o.attempt for o in outcomes],
            "statuses": [o.status for o in outcomes],
            "next_attempt_in": [seconds_from_now(o, o.next_attempt_at) for o in outcomes],
            "robots_waits": [o.robots_wait for o in outcomes],
            "last_errors": details,
            "error_classes": [o.error_class for o in outcomes],
            "result_keys": [o.result_key for o in outcomes],
            "result_sizes": [o.result_size for o in outcomes],
            "result_sha256s": [o.result_sha256 for o in outcomes],
            "result_content_types": [o.result_content_type for o in outcomes],
            "outcomes": [o.outcome for o in outcomes],
            "http_statuses": [o.http_status for o in outcomes],
            "error_details": details,
            "durations_ms": [o.duration_ms for o in outcomes],
        },
    ).all()
    return {r.job_id: r.status for r in rows}


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
