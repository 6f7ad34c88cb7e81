"""One attempt of a claimed job, in a worker run's slot: robots.txt, the fetch, the
answer judged by the retry planner, the body stored, and the outcome the main loop writes.
Slots never touch the job's row: they hand their outcome to the main loop.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from pin_orchestration.scraping.fetch.client import Fetcher, FetchResult, request_url
from pin_orchestration.scraping.fetch.errors import FetchError
from pin_orchestration.scraping.fetch.robots import RobotsGuard, RobotsRefusal
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.leases import AttemptOutcome, ClaimedJob
from pin_orchestration.scraping.store.results import ResultStore, result_key
from pin_orchestration.scraping.worker.retry import (
    Decision,
    RetryPolicy,
    decide,
    domain_pause_until,
)


class Flight:
    """One job in a slot: why it should stop, if it should, and when its lease was last
    known to be ours."""

    def __init__(
        self,
        job: ClaimedJob,
        lease_seconds: float,
        claim_sent_at: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job = job
        self.stop_reason: str | None = None  # "cancelled" | "lease_lost" | "worker_stopped"
        self.lease_seconds = lease_seconds
        # The lease runs from the claim's moment in PostgreSQL, which is no later than
        # when the claim was sent: counted from its answer, a claim answered late left
        # the worker trusting a lease that had already mostly run. `renewed_at` is a
        # reading of `clock` (the run's lease clock: time.monotonic but in tests).
        self.renewed_at = claim_sent_at
        self.clock = clock

    @property
    def key(self) -> tuple[uuid.UUID, int]:
        return (self.job.id, self.job.attempt)

    def lease_in_doubt(self) -> bool:
        """True when no renewal has confirmed the lease for most of its length (the
        database unreachable, this process stalled): another worker may own the job now,
        so this one must not write its result."""
        return self.clock() - self.renewed_at > self.lease_seconds * 0.8

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def should_stop(self) -> bool:
        # A lease no renewal has confirmed for most of its length may be swept before the
        # next one: the fetch hangs up now, before another worker can be given the job
        # (cut off from the database while the target answered, it read on to its own
        # deadline beside the job's next owner, past the host's connection limit).
        if self.stop_reason is None and self.lease_in_doubt():
            self.stop("lease_lost")
        return self.stop_reason is not None


def attempt(
    flight: Flight,
    store: ResultStore,
    fetcher: Fetcher,
    redirect_slots: leases.RedirectSlots,
    retry_policy: RetryPolicy,
    rng: random.Random,
    clock: Callable[[], datetime],
    robots: RobotsGuard,
) -> AttemptOutcome | None:
    """One attempt of a claimed job: robots.txt, the fetch, the answer judged, and a body
    worth keeping stored before the outcome says succeeded. None: the lease was lost, the
    job is another worker's and nothing of this attempt is written."""
    job = flight.job
    begun = time.monotonic()
    try:
        fetched = _fetch(flight, fetcher, redirect_slots, robots)
    except RobotsRefusal as refusal:
        return robots.outcome(job, refusal, _elapsed_ms(begun))
    except FetchError as exc:
        return _fetch_failed(flight, exc, retry_policy, rng, clock, begun)
    try:
        decided = Decided.now(clock)
        decision = _judged(job, fetched, retry_policy, rng, decided)
        if decision.outcome != "succeeded":
            return _answer_not_kept(job, fetched, decision, decided, retry_policy, begun)
        if flight.should_stop():  # a lease in doubt included: its result is not stored
            return stopped_outcome(flight, _elapsed_ms(begun), decided, retry_policy.max_attempts)
        key = result_key(job.tenant_id, job.id, job.created_at, job.attempt)
        stored = store.put(
            key,
            fetched.body,
            size=fetched.size,
            sha256=fetched.sha256,
            content_type=_storable_content_type(fetched.content_type),
        )
    finally:
        fetched.close()
    return AttemptOutcome(
        job_id=job.id,
        job_domain=job.domain,
        attempt=job.attempt,
        status="succeeded",
        outcome="succeeded",
        http_status=fetched.status_code,
        duration_ms=_elapsed_ms(begun),
        result_key=stored.key,
        result_size=stored.size,
        result_sha256=stored.sha256,
        result_content_type=stored.content_type,
    )


def _elapsed_ms(begun: float) -> int:
    return int((time.monotonic() - begun) * 1000)


def _fetch(
    flight: Flight,
    fetcher: Fetcher,
    redirect_slots: leases.RedirectSlots,
    robots: RobotsGuard,
) -> FetchResult:
    job = flight.job
    # robots.txt first: a disallowed URL (or redirect hop) is never requested.
    robots.before_fetch(job, request_url(job.url, job.params), redirect_slots, flight.should_stop)
    return fetcher.fetch(
        job.url,
        job.params,
        should_stop=flight.should_stop,
        redirect_slots=redirect_slots,
        check_hop=robots.hop_checker(job, redirect_slots, flight.should_stop),
        timeout_seconds=job.timeout_seconds,
    )


def _fetch_failed(
    flight: Flight,
    exc: FetchError,
    retry_policy: RetryPolicy,
    rng: random.Random,
    clock: Callable[[], datetime],
    begun: float,
) -> AttemptOutcome | None:
    """No answer (or the slot was told to stop): stopped, or retried as its class says."""
    decided = Decided.now(clock)
    if exc.error_class == "cancelled":
        return stopped_outcome(flight, _elapsed_ms(begun), decided, retry_policy.max_attempts)
    decision = decide(
        attempt=flight.job.budget_used,
        status_code=None,
        error_class=exc.error_class,
        retry_after=None,
        policy=retry_policy,
        now=decided.at,
        rng=rng,
    )
    return decided_outcome(flight.job, decision, decided, None, _elapsed_ms(begun))


def _judged(
    job: ClaimedJob,
    fetched: FetchResult,
    retry_policy: RetryPolicy,
    rng: random.Random,
    decided: Decided,
) -> Decision:
    return decide(
        attempt=job.budget_used,
        status_code=fetched.status_code,
        error_class=None,
        retry_after=fetched.headers.get("Retry-After"),
        policy=retry_policy,
        now=decided.at,
        rng=rng,
    )


def _answer_not_kept(
    job: ClaimedJob,
    fetched: FetchResult,
    decision: Decision,
    decided: Decided,
    retry_policy: RetryPolicy,
    begun: float,
) -> AttemptOutcome:
    """An answer that is not a success: the decision, and the pause of the host that gave it."""
    paused_until = domain_pause_until(
        fetched.status_code,
        fetched.headers.get("Retry-After"),
        retry_policy,
        decided.at,
    )
    # The host that answered is paused: after a redirect, the hop's, not the job's.
    answered_by = urlsplit(fetched.final_url).hostname or job.domain
    return decided_outcome(
        job,
        decision,
        decided,
        fetched.status_code,
        _elapsed_ms(begun),
        paused_until,
        answered_by,
    )


def _storable_content_type(value: str | None) -> str | None:
    """The target's Content-Type when it is a sane header value; junk is dropped (the store
    then records application/octet-stream) rather than failing a fetched job."""
    if value is None or len(value) > 255 or not value.isascii() or not value.isprintable():
        return None
    return value


@dataclass(frozen=True)
class Decided:
    """When an outcome was decided: the wall clock its times were computed with, and the
    monotonic clock beside it. The round that writes the outcome turns its times into
    delays from this reading, not from the wall clock at the write: a clock stepped (or
    an outcome held through a database outage) in between must not move them."""

    at: datetime
    monotonic: float

    @classmethod
    def now(cls, clock: Callable[[], datetime]) -> Decided:
        return cls(clock(), time.monotonic())


def decided_outcome(
    job: ClaimedJob,
    decision: Decision,
    decided: Decided,
    http_status: int | None,
    duration_ms: int | None,
    domain_paused_until: datetime | None = None,
    paused_domain: str | None = None,
) -> AttemptOutcome:
    return AttemptOutcome(
        domain=paused_domain or job.domain,
        domain_paused_until=domain_paused_until,
        job_id=job.id,
        job_domain=job.domain,
        attempt=job.attempt,
        status="queued" if decision.outcome == "retry" else decision.outcome,
        outcome=decision.outcome,
        http_status=http_status,
        error_class=decision.error_class,
        error_detail=decision.error_detail,
        duration_ms=duration_ms,
        next_attempt_at=decision.next_attempt_at,
        decided_at=decided.at,
        decided_monotonic=decided.monotonic,
    )


def stopped_outcome(
    flight: Flight, duration_ms: int, decided: Decided, max_attempts: int
) -> AttemptOutcome | None:
    job = flight.job
    if flight.stop_reason == "cancelled":
        return AttemptOutcome(
            job_id=job.id,
            job_domain=job.domain,
            attempt=job.attempt,
            status="cancelled",
            outcome="cancelled",
            error_class="cancelled",
            error_detail="cancelled by the client while running",
            duration_ms=duration_ms,
        )
    if flight.stop_reason == "lease_lost":
        # The job is someone else's now; the database would refuse any write of ours.
        return None
    if job.budget_used >= max_attempts:
        # The claim counted this attempt: handed back, the job would get one past its
        # budget (and one more at every stop). The sweeper fails a lost last attempt too.
        return AttemptOutcome(
            job_id=job.id,
            job_domain=job.domain,
            attempt=job.attempt,
            status="failed",
            outcome="failed",
            error_class="worker_stopped",
            error_detail=(
                f"the worker run was stopped during the last attempt ({job.budget_used} of "
                f"{max_attempts}); not retried (pin scraping requeue gives a fresh budget)"
            ),
            duration_ms=duration_ms,
        )
    return _retry_now(job, "worker_stopped", "the worker run was stopped; handed back", decided)


def _retry_now(job: ClaimedJob, error_class: str, detail: str, decided: Decided) -> AttemptOutcome:
    return AttemptOutcome(
        job_id=job.id,
        job_domain=job.domain,
        attempt=job.attempt,
        status="queued",
        outcome="retry",
        error_class=error_class,
        error_detail=detail,
        next_attempt_at=decided.at,
        decided_at=decided.at,
        decided_monotonic=decided.monotonic,
    )
