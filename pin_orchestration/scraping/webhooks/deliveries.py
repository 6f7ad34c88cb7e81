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

from sqlalchemy import Connection, Engine, text

from pin_orchestration.platform.options import option
from pin_orchestration.platform.sql import load_queries
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.fetch.errors import FetchError
from pin_orchestration.scraping.fetch.headers import parse_retry_after
from pin_orchestration.scraping.webhooks import signing
from pin_orchestration.scraping.worker.retry import RetryPolicy, backoff_delay

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


def _q(name: str) -> Any:
    return text(load_queries("pin_orchestration.scraping", "webhooks.sql")[name])


class WebhookConfigError(ValueError):
    """The delivery loop's options are invalid; raised before any work."""


@dataclass(frozen=True)
class WebhookPolicy:
    max_attempts: int = 8
    backoff_base_seconds: float = 5.0
    backoff_cap_seconds: float = 3600.0
    # Timeout of one delivery (connect, read and the whole call).
    timeout_seconds: float = 10.0
    # After a rotation, deliveries carry the replaced secret's signature this long too.
    secret_overlap_seconds: float = 86400.0

    def validate(self) -> None:
        problems = [
            f"{name} must be > 0 (got {getattr(self, name)})"
            for name in (
                "max_attempts",
                "backoff_base_seconds",
                "backoff_cap_seconds",
                "timeout_seconds",
            )
            if not getattr(self, name) > 0
        ]
        if not self.secret_overlap_seconds >= 0:
            problems.append(
                f"secret_overlap_seconds must be >= 0 (got {self.secret_overlap_seconds})"
            )
        if problems:
            raise WebhookConfigError("invalid webhook delivery policy: " + "; ".join(problems))

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            backoff_base_seconds=self.backoff_base_seconds,
            backoff_cap_seconds=self.backoff_cap_seconds,
        )

    @property
    def lease_seconds(self) -> float:
        # The claim must outlive the call (the Fetcher's deadline) and the recording; a
        # delivery is claimed only when a slot sends it at once, so one call is all it spans.
        return 2 * self.timeout_seconds + 30


@dataclass(frozen=True)
class DeliveryOptions:
    batch_size: int = option(
        50,
        "Deliveries claimed per round at most (one short transaction; never more than "
        "the free slots)",
    )
    concurrency: int = option(8, "Deliveries in flight at once")
    per_tenant: int = option(
        4,
        "Deliveries of one tenant in flight at once (at most `concurrency`, and one "
        "slot short of it when there are more than one): the other slots stay free for "
        "the other tenants while one tenant's receiver hangs",
    )
    max_run_duration_seconds: float = option(
        240.0, "Stop claiming after this long; the sensor launches the next run"
    )

    @property
    def tenant_share(self) -> int:
        """The slots one tenant may hold: `per_tenant`, but one short of them all when
        there are more than one, so a tenant whose receiver hangs never holds every slot
        (per_tenant == concurrency let it: the other tenants waited for its timeouts)."""
        if self.concurrency <= 1:
            return self.per_tenant
        return min(self.per_tenant, self.concurrency - 1)

    def validate(self) -> None:
        problems = [
            f"{name} must be > 0 (got {getattr(self, name)})"
            for name in ("batch_size", "concurrency", "per_tenant", "max_run_duration_seconds")
            if not getattr(self, name) > 0
        ]
        if self.per_tenant > self.concurrency:
            problems.append(
                f"per_tenant must be <= concurrency ({self.concurrency}) (got {self.per_tenant})"
            )
        if problems:
            raise WebhookConfigError("invalid webhook delivery options: " + "; ".join(problems))


# --- the wire format ---------------------------------------------------------------------


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
    rng = rng or random.Random()
    report = DeliveryReport()
    started = time.monotonic()
    in_flight: dict[Future[_Attempt], _Claimed] = {}
    # A claim that failed ends the claiming; the run raises it once the deliveries in
    # flight are recorded (raised at once, their answers were dropped: each POSTed again
    # when its lease ended, an attempt of its budget spent on nothing).
    claim_error: Exception | None = None
    # When each delivery in flight was claimed until (monotonic), by job.
    lease_ends: dict[uuid.UUID, float] = {}
    # Outcomes whose record failed (the database blipped): dropped, each was POSTed again
    # once its lease ended, an attempt of its budget spent on nothing.
    unrecorded: list[_Unrecorded] = []
    with ThreadPoolExecutor(options.concurrency, thread_name_prefix="pin-webhook") as pool:
        while True:
            claiming = (
                claim_error is None
                and not (stop is not None and stop.is_set())
                and time.monotonic() - started < options.max_run_duration_seconds
            )
            claimed: list[_Claimed] = []
            free = options.concurrency - len(in_flight)
            if claiming and free > 0:
                busy = Counter(job.tenant_id for job in in_flight.values())
                try:
                    claimed = _claim(
                        engine,
                        min(free, options.batch_size),
                        policy.lease_seconds,
                        options.tenant_share,
                        busy,
                        policy.secret_overlap_seconds,
                    )
                except Exception as exc:
                    log.warning(
                        "webhook claim failed; recording the %d deliveries in flight, then "
                        "ending the run",
                        len(in_flight),
                        exc_info=True,
                    )
                    claim_error, claiming = exc, False
                report.claimed += len(claimed)
                lease_end = time.monotonic() + policy.lease_seconds
                for job in claimed:
                    future = pool.submit(_deliver, fetcher, policy, job, rng)
                    in_flight[future] = job
                    lease_ends[job.id] = lease_end
            if not in_flight and not unrecorded:
                break  # nothing due that this loop may take, nothing in flight
            done: set[Future[_Attempt]] = set()
            if in_flight:
                # A slot freed, or a while to look for what fell due (or a tenant's turn),
                # or to try a failed record again.
                done, _ = wait(
                    in_flight,
                    timeout=IDLE_POLL_SECONDS if claiming or unrecorded else None,
                    return_when=FIRST_COMPLETED,
                )
            else:
                time.sleep(max(0.0, min(u.retry_at for u in unrecorded) - time.monotonic()))
            now = time.monotonic()
            settling = [u for u in unrecorded if u.retry_at <= now]
            unrecorded = [u for u in unrecorded if u.retry_at > now]
            for future in done:
                # _deliver never raises: whatever went wrong is that delivery's outcome.
                job = in_flight.pop(future)
                settling.append(_Unrecorded(job, future.result(), lease_ends.pop(job.id), now))
            for item in settling:
                job, attempt = item.job, item.attempt
                # One by one, each in its own transaction: one delivery's record cannot
                # take the others' down with it.
                recorded = _record(engine, job, attempt)
                if recorded is None and time.monotonic() < item.lease_ends:
                    retry_at = time.monotonic() + RECORD_RETRY_SECONDS
                    unrecorded.append(_Unrecorded(job, attempt, item.lease_ends, retry_at))
                if not recorded:
                    continue
                if attempt.outcome == "delivered":
                    report.delivered += 1
                elif attempt.outcome == "retry":
                    report.retried += 1
                else:
                    report.gave_up += 1
                if attempt.error_class is not None:
                    report.by_error_class[attempt.error_class] = (
                        report.by_error_class.get(attempt.error_class, 0) + 1
                    )
    if claim_error is not None:
        raise claim_error
    return report


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
