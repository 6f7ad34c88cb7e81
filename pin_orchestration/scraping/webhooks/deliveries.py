"""Completion webhooks (SPEC SCR-11): tell a client's `callback_url` that its job finished.

At least once, through the database: a finished job with a callback owes a delivery while
`scraping.jobs.finish_published_at` is NULL (the finishing transaction leaves it so). A
delivery loop claims due deliveries with a lease (`FOR UPDATE SKIP LOCKED`, committed
before any call) only as slots free up, each tenant up to its share of the slots (one
tenant's hanging receiver cannot hold everyone's), POSTs outside any transaction
through the Fetcher — the same SSRF guard, timeout and deadline as the scraper's
fetches — and records each attempt, one by one, for the finish it announced: a 2xx
closes the delivery, anything else (an exception included: one receiver's malformed answer
is its own delivery's failure, never the run's) is retried after a backoff with full
jitter until `max_attempts`, when it is given up (recorded, and closed). A delivery
claimed again past `max_attempts` (its last attempt sent, its record lost) is given up
unsent. A refused or malformed callback address is given up at once: no packet is ever
sent to it.

Signed as Standard Webhooks 1.0 (signing.py; docs/integration.md, "Verifying a
webhook"), with the tenant's secret and, for PIN_WEBHOOK_SECRET_OVERLAP_SECONDS after a
rotation, with the secret it replaced as well.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.fetch.errors import FetchError
from pin_orchestration.scraping.fetch.headers import parse_retry_after
from pin_orchestration.scraping.webhooks import signing
from pin_orchestration.scraping.webhooks.options import DeliveryOptions, WebhookPolicy
from pin_orchestration.scraping.worker.retry import backoff_delay

# Answer classes that no retry can change: the address is refused or the URL is unusable.
_GIVE_UP_AT_ONCE = frozenset({"refused_address", "invalid_url"})
# The error class of a delivery that failed in a way the fetcher does not classify (an
# answer a library choked on, or a bug): retried with backoff like any other failure.
DELIVERY_ERROR = "delivery_error"
# The error class of a delivery claimed past its budget: the budget's last attempt was
# POSTed and its outcome never recorded (the run killed, or the database gone between the
# POST and its record), so its lease ended and the next claim counted one attempt more.
# Nothing is sent for it; the delivery is given up.
ATTEMPT_UNRECORDED = "attempt_unrecorded"
_MAX_DETAIL_CHARS = 300
# While deliveries are in flight, how often the loop looks for newly due ones (another
# tenant's, or one whose turn came) even if no slot has freed.
IDLE_POLL_SECONDS = 0.2
# How often an outcome whose record failed is tried again, while its claim lasts.
RECORD_RETRY_SECONDS = 1.0

log = logging.getLogger(__name__)


_q = NamedQueries("pin_orchestration.scraping", "webhooks.sql")


def webhook_body(job_id: uuid.UUID, status: str, finished_at: datetime) -> bytes:
    """`{"id", "status", "finished_at"}` as compact JSON (what is signed is these bytes)."""
    return json.dumps(
        {
            "id": str(job_id),
            "status": status,
            "finished_at": finished_at.astimezone(UTC).isoformat(),
        },
        separators=(",", ":"),
    ).encode()


# --- tenants' secrets --------------------------------------------------------------------


def tenant_webhook_secret(engine: Engine, name: str, *, rotate: bool = False) -> dict[str, Any]:
    """The tenant's webhook secret (a new one when `rotate`); KeyError for an unknown
    tenant."""
    with engine.begin() as conn:
        if rotate:
            row = conn.execute(
                _q("rotate_tenant_webhook_secret"),
                {"name": name, "webhook_secret": signing.new_secret()},
            ).one_or_none()
        else:
            row = conn.execute(_q("tenant_webhook_secret"), {"name": name}).one_or_none()
    if row is None:
        raise KeyError(f"no tenant {name!r} (pin tenant list shows them)")
    return dict(row._mapping)


# --- the delivery loop -------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookStats:
    due: int
    pending: int


def webhook_stats(conn: Connection) -> WebhookStats:
    row = conn.execute(_q("webhook_stats")).one()
    return WebhookStats(due=int(row.due), pending=int(row.pending))


def list_deliveries(conn: Connection, job_id: uuid.UUID) -> list[dict[str, Any]]:
    return [
        dict(r._mapping) for r in conn.execute(_q("list_webhook_deliveries"), {"job_id": job_id})
    ]


@dataclass
class DeliveryReport:
    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    gave_up: int = 0
    by_error_class: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Claimed:
    id: uuid.UUID
    tenant_id: uuid.UUID
    callback_url: str
    status: str
    finished_at: datetime
    number: int
    secrets: tuple[str, ...]  # the current one first; the replaced one during an overlap
    # The database's clock at the claim, and time.monotonic() beside it: a delivery is
    # signed (and a receiver's Retry-After read) by the database's clock carried forward,
    # never by this host's wall clock, whose skew would make every signature stale.
    db_now: datetime
    claimed_monotonic: float

    def db_clock(self) -> datetime:
        return self.db_now + timedelta(seconds=time.monotonic() - self.claimed_monotonic)


@dataclass(frozen=True)
class _Unrecorded:
    """An outcome whose record failed, kept to be tried again until `lease_ends` (then
    another run may claim the delivery and send it again, which at-least-once allows)."""

    job: _Claimed
    attempt: _Attempt
    lease_ends: float
    retry_at: float


@dataclass(frozen=True)
class _Attempt:
    outcome: str  # delivered | retry | gave_up
    http_status: int | None
    error_class: str | None
    error_detail: str | None
    duration_ms: int
    # Seconds from the record to the retry, added to the database's clock (the one the
    # claim reads): a due time on this host's clock moves with its skew.
    retry_in_seconds: float | None


def run_deliveries(
    engine: Engine,
    fetcher: Fetcher,
    policy: WebhookPolicy,
    options: DeliveryOptions | None = None,
    *,
    stop: threading.Event | None = None,
    rng: random.Random | None = None,
) -> DeliveryReport:
    """Deliver what is due, batch after batch, until nothing is due, the run's time is up
    or `stop` is set. Deliveries whose retry falls due later are left to the next run."""
    options = options or DeliveryOptions()
    policy.validate()
    options.validate()
    return _DeliveryRun(engine, fetcher, policy, options, stop, rng or random.Random()).run()


class _DeliveryRun:
    """One delivery run: its loop (claim into free slots, wait for answers, record them)
    and what the loop keeps between rounds."""

    def __init__(
        self,
        engine: Engine,
        fetcher: Fetcher,
        policy: WebhookPolicy,
        options: DeliveryOptions,
        stop: threading.Event | None,
        rng: random.Random,
    ) -> None:
        self.engine, self.fetcher, self.policy, self.options = engine, fetcher, policy, options
        self.stop, self.rng = stop, rng
        self.report = DeliveryReport()
        self.started = time.monotonic()
        self.in_flight: dict[Future[_Attempt], _Claimed] = {}
        # A claim that failed ends the claiming; the run raises it once the deliveries in
        # flight are recorded (raised at once, their answers were dropped: each POSTed again
        # when its lease ended, an attempt of its budget spent on nothing).
        self.claim_error: Exception | None = None
        # When each delivery in flight was claimed until (monotonic), by job.
        self.lease_ends: dict[uuid.UUID, float] = {}
        # Outcomes whose record failed (the database blipped): dropped, each was POSTed
        # again once its lease ended, an attempt of its budget spent on nothing.
        self.unrecorded: list[_Unrecorded] = []

    def run(self) -> DeliveryReport:
        with ThreadPoolExecutor(self.options.concurrency, thread_name_prefix="pin-webhook") as pool:
            while True:
                claiming = self._may_claim() and self._claim_into_slots(pool)
                if not self.in_flight and not self.unrecorded:
                    break  # nothing due that this loop may take, nothing in flight
                self._record(self._wait_for_answers(claiming))
        if self.claim_error is not None:
            raise self.claim_error
        return self.report

    def _may_claim(self) -> bool:
        return (
            self.claim_error is None
            and not (self.stop is not None and self.stop.is_set())
            and time.monotonic() - self.started < self.options.max_run_duration_seconds
        )

    def _claim_into_slots(self, pool: ThreadPoolExecutor) -> bool:
        """Claim what due deliveries the free slots take and send each; False when the
        claim failed (the run claims no more)."""
        free = self.options.concurrency - len(self.in_flight)
        if free <= 0:
            return True
        busy = Counter(job.tenant_id for job in self.in_flight.values())
        claimed: list[_Claimed] = []
        try:
            claimed = _claim(
                self.engine,
                min(free, self.options.batch_size),
                self.policy.lease_seconds,
                self.options.tenant_share,
                busy,
                self.policy.secret_overlap_seconds,
            )
        except Exception as exc:
            log.warning(
                "webhook claim failed; recording the %d deliveries in flight, then ending the run",
                len(self.in_flight),
                exc_info=True,
            )
            self.claim_error = exc
        self.report.claimed += len(claimed)
        lease_end = time.monotonic() + self.policy.lease_seconds
        for job in claimed:
            future = pool.submit(_deliver, self.fetcher, self.policy, job, self.rng)
            self.in_flight[future] = job
            self.lease_ends[job.id] = lease_end
        return self.claim_error is None

    def _wait_for_answers(self, claiming: bool) -> list[_Unrecorded]:
        """The outcomes to record now: the answers that came, and the failed records whose
        retry is due."""
        done: set[Future[_Attempt]] = set()
        if self.in_flight:
            # A slot freed, or a while to look for what fell due (or a tenant's turn), or
            # to try a failed record again.
            done, _ = wait(
                self.in_flight,
                timeout=IDLE_POLL_SECONDS if claiming or self.unrecorded else None,
                return_when=FIRST_COMPLETED,
            )
        else:
            time.sleep(max(0.0, min(u.retry_at for u in self.unrecorded) - time.monotonic()))
        now = time.monotonic()
        settling = [u for u in self.unrecorded if u.retry_at <= now]
        self.unrecorded = [u for u in self.unrecorded if u.retry_at > now]
        for future in done:
            # _deliver never raises: whatever went wrong is that delivery's outcome.
            job = self.in_flight.pop(future)
            settling.append(_Unrecorded(job, future.result(), self.lease_ends.pop(job.id), now))
        return settling

    def _record(self, settling: list[_Unrecorded]) -> None:
        for item in settling:
            job, attempt = item.job, item.attempt
            # One by one, each in its own transaction: one delivery's record cannot take
            # the others' down with it.
            recorded = _record(self.engine, job, attempt)
            if recorded is None and time.monotonic() < item.lease_ends:
                retry_at = time.monotonic() + RECORD_RETRY_SECONDS
                self.unrecorded.append(_Unrecorded(job, attempt, item.lease_ends, retry_at))
            if recorded:
                self._count(attempt)

    def _count(self, attempt: _Attempt) -> None:
        if attempt.outcome == "delivered":
            self.report.delivered += 1
        elif attempt.outcome == "retry":
            self.report.retried += 1
        else:
            self.report.gave_up += 1
        if attempt.error_class is not None:
            self.report.by_error_class[attempt.error_class] = (
                self.report.by_error_class.get(attempt.error_class, 0) + 1
            )


def _claim(
    engine: Engine,
    limit: int,
    lease_seconds: float,
    per_tenant: int,
    busy: Counter[uuid.UUID],
    secret_overlap_seconds: float,
) -> list[_Claimed]:
    began = time.monotonic()  # now() is the claim transaction's start
    with engine.begin() as conn:
        rows = conn.execute(
            _q("claim_webhooks"),
            {
                "limit": limit,
                "lease_seconds": lease_seconds,
                "per_tenant": per_tenant,
                "busy_tenants": [str(t) for t in busy],
                "busy_counts": list(busy.values()),
                "secret_overlap_seconds": secret_overlap_seconds,
            },
        ).all()
    return [
        _Claimed(
            r.id,
            r.tenant_id,
            r.callback_url,
            r.status,
            r.finished_at,
            r.webhook_attempts,
            tuple(s for s in (r.webhook_secret, r.webhook_secret_previous) if s is not None),
            r.db_now,
            began,
        )
        for r in rows
    ]


def _deliver(
    fetcher: Fetcher,
    policy: WebhookPolicy,
    job: _Claimed,
    rng: random.Random,
) -> _Attempt:
    """One delivery and its outcome. Never raises: an answer no library expected (a
    `Content-Length: ²`) or a bug of ours is this delivery's failed attempt, retried
    with backoff up to the cap like any other, and never the run's end."""
    detail: str | None
    if job.number > policy.max_attempts:
        # Sending it would be a POST past the budget the receiver was promised.
        detail = (
            f"claimed as attempt {job.number} of {policy.max_attempts}: the last was sent "
            "and its outcome never recorded (or the budget was lowered); nothing more is sent"
        )
        return _Attempt("gave_up", None, ATTEMPT_UNRECORDED, detail, 0, None)
    started = time.monotonic()
    http_status: int | None = None
    error_class: str | None = None
    detail = None
    retry_after: str | None = None
    try:
        body = webhook_body(job.id, job.status, job.finished_at)
        msg_id = signing.event_id(job.id, job.status, job.finished_at)
        signed_at = job.db_clock().timestamp()
        headers = signing.signed_headers(job.secrets, msg_id, body, now=signed_at)
        with fetcher.post(job.callback_url, body, headers) as answer:
            http_status = answer.status_code
            retry_after = answer.headers.get("Retry-After")
    except FetchError as exc:
        error_class, detail = exc.error_class, exc.detail
    except Exception as exc:
        log.warning("webhook of job %s: unexpected error", job.id, exc_info=True)
        error_class, detail = DELIVERY_ERROR, f"{type(exc).__name__}: {exc}"
    duration_ms = int((time.monotonic() - started) * 1000)
    if detail is not None:
        detail = _printable(detail)[:_MAX_DETAIL_CHARS]
    if http_status is not None and 200 <= http_status < 300:
        return _Attempt("delivered", http_status, None, None, duration_ms, None)
    if http_status is not None:
        error_class, detail = f"http_{http_status}", f"the receiver answered {http_status}"
    if error_class in _GIVE_UP_AT_ONCE or job.number >= policy.max_attempts:
        return _Attempt("gave_up", http_status, error_class, detail, duration_ms, None)
    delay = backoff_delay(job.number, policy.retry_policy(), rng)
    # The same rule as a target's (retry.decide): never earlier than the backoff nor than
    # the receiver's Retry-After, that capped (here by backoff_cap_seconds); one asking for
    # no wait (0, a past date) is as if absent.
    now = job.db_clock()
    not_before = parse_retry_after(retry_after, now)
    if not_before is not None:
        asked = (not_before - now).total_seconds()
        delay = max(delay, min(asked, policy.backoff_cap_seconds))
    return _Attempt("retry", http_status, error_class, detail, duration_ms, delay)


def _printable(text: str) -> str:
    """`text` with what is not printable escaped: a receiver's answer quoted in an error
    (a status line of raw bytes) may hold a NUL, which PostgreSQL refuses in text, and the
    attempt would never be recorded (its webhook sent again and again)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _record(engine: Engine, job: _Claimed, attempt: _Attempt) -> bool | None:
    """One delivery's outcome in its own transaction: True when recorded, False when the
    delivery is no longer this attempt's, None when the record failed (worth another
    try while the claim lasts). Written only for the finish it announced (the job's
    `finished_at`, which the webhook carries): a job requeued and finished again meanwhile
    owes its new finish a delivery of its own, whatever this one's answer was."""
    try:
        with engine.begin() as conn:
            recorded = conn.execute(
                _q("record_webhook_attempt"),
                {
                    "job_id": job.id,
                    "number": job.number,
                    "job_status": job.status,
                    "finished_at": job.finished_at,
                    "url": job.callback_url,
                    "outcome": attempt.outcome,
                    "http_status": attempt.http_status,
                    "error_class": attempt.error_class,
                    "error_detail": attempt.error_detail,
                    "duration_ms": attempt.duration_ms,
                    "retry_in_seconds": attempt.retry_in_seconds,
                },
            ).one_or_none()
    except Exception:
        log.warning(
            "webhook of job %s: attempt %d not recorded (tried again while its claim lasts)",
            job.id,
            job.number,
            exc_info=True,
        )
        return None
    if recorded is None:
        log.info(
            "webhook of job %s: finished again meanwhile, attempt %d not recorded",
            job.id,
            job.number,
        )
        return False
    if attempt.outcome == "gave_up":
        log.warning(
            "webhook of job %s given up after attempt %d: %s %s",
            job.id,
            job.number,
            attempt.error_class,
            attempt.error_detail,
        )
    return True
