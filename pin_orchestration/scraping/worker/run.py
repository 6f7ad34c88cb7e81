"""A worker run: claim due jobs with a lease, fetch them in bounded slots, store results,
record outcomes (SCR-3, SCR-5, SCR-6, SCR-10).

One run drains many jobs (a Dagster run costs seconds to launch). The main loop owns the
database: each round it writes the outcomes the slots produced (one transaction for the
round), then claims as many due jobs as there are free slots (one statement). Slot
threads only fetch and store. A renewal thread extends the leases of jobs in flight and
brings back cancel requests; a job whose lease was lost stops fetching, and its outcome
is refused by the database (the write checks owner and attempt number), so a late worker
never overwrites the job's new owner.

Order that keeps "succeeded" honest: the body is written to the results store first, and
only then is the job marked succeeded, in the same transaction that records the attempt.
Each attempt writes an object of its own (`…/{job}/{attempt}`), so a late worker's put never
replaces the object the job reports; an attempt whose finish is refused (its lease lost) or
overruled (a cancel asked while it ran) deletes its object, and pin-retention deletes what a
worker killed in between left.

The database may go away (restarted, cut, hung) while jobs are in flight: claims, renewals
and outcome writes are retried with backoff, and outcomes stay in memory until written (also
when the run is stopped), so what was fetched is not fetched again.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

from sqlalchemy import Engine, text

from pin_orchestration.platform.options import option, same_as, with_settings
from pin_orchestration.platform.sql import load_queries
from pin_orchestration.scraping.fetch.client import Fetcher, FetchError, request_url
from pin_orchestration.scraping.fetch.robots import RobotsGuard, RobotsRefusal
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store import repository
from pin_orchestration.scraping.store.repository import AttemptOutcome, ClaimedJob, DomainDefaults
from pin_orchestration.scraping.store.results import ResultStore, result_key
from pin_orchestration.scraping.worker.retry import (
    Decision,
    RetryPolicy,
    decide,
    domain_pause_until,
)

log = logging.getLogger(__name__)


# The longest a worker with free slots waits before asking for due jobs again.
MAX_POLL_SECONDS = 1.0
# Backoff between tries of a database call that failed (claim, renewal, outcome write).
DB_RETRY_FIRST_SECONDS = 0.25
DB_RETRY_MAX_SECONDS = 5.0
# How long a stopping run keeps trying to write its outcomes to an unreachable database,
# at least (a lease's length when longer: past it the jobs are the sweeper's anyway).
FINAL_WRITE_MIN_SECONDS = 30.0


def claim_due_jobs(
    engine: Engine,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    domain_defaults: DomainDefaults,
) -> list[ClaimedJob]:
    """The pick: up to `limit` due jobs, by priority (6:3:1), tenant (fair, weighted),
    domain with room (rate, connections, pauses) and age. The statement is queries.sql's
    `claim_due_jobs`; the function it calls, scraping.claim_jobs, is
    scraping/sql/claim_jobs.sql (docs/jobs/scraping.md, "Scheduling")."""
    if limit <= 0:
        return []
    with engine.begin() as conn:
        rows = conn.execute(
            text(load_queries("pin_orchestration.scraping", "queries.sql")["claim_due_jobs"]),
            {
                "worker": worker,
                "limit": limit,
                "lease_seconds": lease_seconds,
                "default_rps": domain_defaults.rps,
                "default_concurrency": domain_defaults.concurrency,
            },
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
            domain=r.domain,
            priority=r.priority,
            timeout_seconds=r.timeout_seconds,
            claimed_at=r.claimed_at,
        )
        for r in rows
    ]


class ClaimFn(Protocol):
    def __call__(
        self,
        engine: Engine,
        *,
        worker: str,
        limit: int,
        lease_seconds: float,
        domain_defaults: DomainDefaults,
    ) -> list[ClaimedJob]: ...


class WorkerConfigError(ValueError):
    """A worker option out of range (names the option)."""


# What a worker run (Dagster config) and `pin scraping work` let an operator set.
WORKER_RUN_OPTIONS = ("slots", "idle_exit_seconds", "max_run_duration_seconds")


@dataclass(frozen=True)
class WorkerOptions:
    """One worker run's options; the deployment's settings among them (`same_as`) are
    declared in ScrapingSettings, so a run that leaves them empty takes the variables'."""

    slots: int = same_as(ScrapingSettings, "slots")
    lease_seconds: float = same_as(ScrapingSettings, "lease_seconds")
    idle_exit_seconds: float = option(5.0, "End the run after this long with nothing claimable")
    max_run_duration_seconds: float = option(
        600.0, "Stop claiming after this long; jobs in flight finish"
    )
    poll_seconds: float = option(
        0.2, "How long the loop waits for a slot to finish before looking for new due jobs"
    )
    # Limits of a domain without an override.
    domain_rps: float = same_as(ScrapingSettings, "domain_rps")
    domain_concurrency: int = same_as(ScrapingSettings, "domain_concurrency")
    # robots.txt (scraping/fetch/robots.py)
    robots: str = same_as(ScrapingSettings, "robots")
    robots_retry_seconds: float = same_as(ScrapingSettings, "robots_retry_seconds")

    @classmethod
    def from_settings(cls, settings: ScrapingSettings, **given: Any) -> WorkerOptions:
        """The options given, the deployment's settings for those not given (or None)."""
        return with_settings(cls, settings, **given)

    @property
    def domain_defaults(self) -> DomainDefaults:
        return DomainDefaults(rps=self.domain_rps, concurrency=self.domain_concurrency)

    def validate(self) -> None:
        for name in (
            "slots",
            "lease_seconds",
            "idle_exit_seconds",
            "max_run_duration_seconds",
            "poll_seconds",
            "domain_rps",
            "domain_concurrency",
            "robots_retry_seconds",
        ):
            if not getattr(self, name) > 0:
                raise WorkerConfigError(f"{name} must be > 0 (got {getattr(self, name)!r})")
        if self.robots not in ("obey", "ignore"):
            raise WorkerConfigError(f"robots must be obey or ignore (got {self.robots!r})")


@dataclass
class DayReport:
    """What a run wrote for one day's partition of scraping/results."""

    jobs_stored: int = 0
    bytes: int = 0
    failures_by_class: Counter[str] = field(default_factory=Counter)


@dataclass
class WorkerReport:
    worker: str
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    lease_lost: int = 0
    peak_in_flight: int = 0
    by_day: dict[date, DayReport] = field(default_factory=dict)

    def day(self, d: date) -> DayReport:
        return self.by_day.setdefault(d, DayReport())


class _Flight:
    """One job in a slot: why it should stop, if it should, and when its lease was last
    known to be ours."""

    def __init__(self, job: ClaimedJob, lease_seconds: float, claim_sent_at: float) -> None:
        self.job = job
        self.stop_reason: str | None = None  # "cancelled" | "lease_lost" | "worker_stopped"
        self.lease_seconds = lease_seconds
        # The lease runs from the claim's moment in PostgreSQL, which is no later than
        # when the claim was sent: counted from its answer, a claim answered late left
        # the worker trusting a lease that had already mostly run.
        self.renewed_at = claim_sent_at

    @property
    def key(self) -> tuple[uuid.UUID, int]:
        return (self.job.id, self.job.attempt)

    def lease_in_doubt(self) -> bool:
        """True when no renewal has confirmed the lease for most of its length (the
        database unreachable, this process stalled): another worker may own the job now,
        so this one must not write its result."""
        return time.monotonic() - self.renewed_at > self.lease_seconds * 0.8

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


def run_worker(
    engine: Engine,
    store: ResultStore,
    fetcher: Fetcher,
    retry_policy: RetryPolicy,
    options: WorkerOptions,
    *,
    worker_id: str | None = None,
    stop: threading.Event | None = None,
    rng: random.Random | None = None,
    on_round: Callable[[WorkerReport], None] | None = None,
    claim: ClaimFn = claim_due_jobs,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> WorkerReport:
    """Drain due jobs until nothing is claimable for `idle_exit_seconds`, the max duration
    passes, or `stop` is set; jobs in flight finish (or are handed back) before returning.

    `claim` is the pick; the FIFO baseline of bench/noisy_neighbour.py passes its own.
    `clock` is the wall clock retries and pauses are decided with (the fault suite jumps
    it); they reach the database as delays, so its skew does not move them."""
    options.validate()
    worker = worker_id or f"worker-{uuid.uuid4()}"
    stop = stop or threading.Event()
    rng = rng or random.Random()
    report = WorkerReport(worker=worker)
    # Keyed by (job, attempt): a run may claim its own swept job again while the old
    # attempt's slot still runs, and the two must not share an entry (the old slot's end
    # would drop the new attempt, whose lease would then go unrenewed).
    flights: dict[tuple[uuid.UUID, int], _Flight] = {}
    flights_lock = threading.Lock()
    outcomes: queue.Queue[tuple[AttemptOutcome, datetime]] = queue.Queue()
    # Outcomes taken from the queue and not yet written (the database unreachable).
    unwritten: list[tuple[AttemptOutcome, datetime]] = []
    database = _Backoff()
    wake = threading.Event()
    robots = RobotsGuard(
        engine,
        fetcher,
        mode=options.robots,
        owner=worker,
        domain_defaults=options.domain_defaults,
        retry_seconds=options.robots_retry_seconds,
        max_pause_seconds=retry_policy.max_pause_seconds,
        clock=clock,
    )

    def process(flight: _Flight) -> None:
        try:
            slots = repository.RedirectSlots(
                engine,
                flight.job,
                hold_seconds=flight.job.timeout_seconds or fetcher.policy.timeout_seconds,
                domain_defaults=options.domain_defaults,
            )
            outcome = _attempt(flight, store, fetcher, slots, retry_policy, rng, clock, robots)
        except Exception as exc:
            # A bug, or a results store that fails: must not strand the job in running, and
            # must not requeue it at once either (a cause that persists would retry it for
            # ever): a transient attempt, with the job's budget and backoff.
            log.exception("attempt of job %s failed unexpectedly", flight.job.id)
            decided = _Decided.now(clock)
            decision = decide(
                attempt=flight.job.budget_used,
                status_code=None,
                error_class="worker_error",
                error_detail=f"{type(exc).__name__}: {exc}",
                retry_after=None,
                policy=retry_policy,
                now=decided.at,
                rng=rng,
            )
            outcome = _decided(flight.job, decision, decided, None, None)
        if outcome is not None:
            outcomes.put((outcome, flight.job.created_at))
        with flights_lock:
            flights.pop(flight.key, None)
        wake.set()

    renewal_done = threading.Event()
    renewer = threading.Thread(
        target=_renew_leases_until,
        args=(engine, worker, options.lease_seconds, flights, flights_lock, renewal_done),
        name=f"{worker}-lease-renewal",
        daemon=True,
    )
    renewer.start()
    started = time.monotonic()
    idle_since: float | None = None
    empty_claims = 0
    try:
        with ThreadPoolExecutor(max_workers=options.slots, thread_name_prefix=worker) as pool:
            while True:
                _drain(outcomes, unwritten)
                if unwritten and database.due():
                    _try_write(
                        engine,
                        worker,
                        store,
                        unwritten,
                        report,
                        clock,
                        database,
                        retry_policy.max_pause_seconds,
                    )
                now = time.monotonic()
                if stop.is_set() or now - started >= options.max_run_duration_seconds:
                    break
                with flights_lock:
                    free = options.slots - len(flights)
                claimed: list[ClaimedJob] = []
                claim_sent_at = time.monotonic()
                if free > 0 and database.due():
                    try:
                        claimed = claim(
                            engine,
                            worker=worker,
                            limit=free,
                            lease_seconds=options.lease_seconds,
                            domain_defaults=options.domain_defaults,
                        )
                        database.succeeded()
                    except Exception as exc:
                        database.failed("claim", exc)
                report.claimed += len(claimed)
                with flights_lock:
                    new = [_Flight(job, options.lease_seconds, claim_sent_at) for job in claimed]
                    for flight in new:
                        flights[flight.key] = flight
                    in_flight = len(flights)
                report.peak_in_flight = max(report.peak_in_flight, in_flight)
                for flight in new:
                    pool.submit(process, flight)
                # Idle: nothing in flight and nothing owed to the database (an unreachable
                # database with nothing to hand over also ends the run: nothing is lost).
                if in_flight == 0 and not unwritten:
                    idle_since = idle_since if idle_since is not None else now
                    if now - idle_since >= options.idle_exit_seconds:
                        break
                else:
                    idle_since = None
                if on_round is not None:
                    on_round(report)
                # A full pool waits for a slot; a pool with room looks again soon — later
                # and later while claims come back empty (every due job's domain is at its
                # limit: asking again at once only holds the claim lock), but at once when a
                # job of ours finishes, since that frees a connection of its domain.
                empty_claims = empty_claims + 1 if free > 0 and not claimed else 0
                wait = min(options.poll_seconds * 2 ** min(empty_claims, 10), MAX_POLL_SECONDS)
                wake.wait(min(wait, database.wait_seconds()))
                wake.clear()
            if stop.is_set():
                with flights_lock:
                    for flight in flights.values():
                        flight.stop("worker_stopped")
        # The pool has drained: every slot's outcome is queued. They are written before the
        # run ends, through a database outage of up to a lease's length.
        _drain(outcomes, unwritten)
        deadline = time.monotonic() + max(options.lease_seconds, FINAL_WRITE_MIN_SECONDS)
        while unwritten:
            database.sleep_until_due()
            if _try_write(
                engine,
                worker,
                store,
                unwritten,
                report,
                clock,
                database,
                retry_policy.max_pause_seconds,
            ):
                break
            if time.monotonic() >= deadline:
                log.error(
                    "%d outcomes could not be written (database unreachable); the sweeper "
                    "requeues their jobs when their leases run out",
                    len(unwritten),
                )
                break
    finally:
        renewal_done.set()
        renewer.join(timeout=5)
        robots.close()
    return report


class _Backoff:
    """When a failing database may be tried again: exponential backoff with jitter, reset
    by a success. Shared by the main loop's claims and writes (one database, one verdict)."""

    def __init__(self) -> None:
        self.failures = 0
        self._next_try = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next_try

    def wait_seconds(self) -> float:
        return max(self._next_try - time.monotonic(), 0.0) if self.failures else MAX_POLL_SECONDS

    def sleep_until_due(self) -> None:
        time.sleep(max(self._next_try - time.monotonic(), 0.0))

    def succeeded(self) -> None:
        if self.failures:
            log.info("the database answers again after %d failed calls", self.failures)
        self.failures = 0
        self._next_try = 0.0

    def failed(self, what: str, exc: Exception) -> None:
        delay = min(DB_RETRY_FIRST_SECONDS * 2**self.failures, DB_RETRY_MAX_SECONDS)
        delay *= random.uniform(0.5, 1.0)
        self.failures += 1
        self._next_try = time.monotonic() + delay
        log.warning(
            "%s failed (%s: %s); retrying in %.2f s",
            what,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
            delay,
        )


def _attempt(
    flight: _Flight,
    store: ResultStore,
    fetcher: Fetcher,
    redirect_slots: repository.RedirectSlots,
    retry_policy: RetryPolicy,
    rng: random.Random,
    clock: Callable[[], datetime],
    robots: RobotsGuard,
) -> AttemptOutcome | None:
    job = flight.job
    begun = time.monotonic()

    def elapsed_ms() -> int:
        return int((time.monotonic() - begun) * 1000)

    try:
        # robots.txt first: a disallowed URL (or redirect hop) is never requested.
        robots.before_fetch(
            job, request_url(job.url, job.params), redirect_slots, flight.should_stop
        )
        fetched = fetcher.fetch(
            job.url,
            job.params,
            should_stop=flight.should_stop,
            redirect_slots=redirect_slots,
            check_hop=robots.hop_checker(job, redirect_slots, flight.should_stop),
            timeout_seconds=job.timeout_seconds,
        )
    except RobotsRefusal as refusal:
        return robots.outcome(job, refusal, elapsed_ms())
    except FetchError as exc:
        decided = _Decided.now(clock)
        if exc.error_class == "cancelled":
            return _stopped(flight, elapsed_ms(), decided, retry_policy.max_attempts)
        decision = decide(
            attempt=job.budget_used,
            status_code=None,
            error_class=exc.error_class,
            retry_after=None,
            policy=retry_policy,
            now=decided.at,
            rng=rng,
        )
        return _decided(job, decision, decided, None, elapsed_ms())
    try:
        decided = _Decided.now(clock)
        decision = decide(
            attempt=job.budget_used,
            status_code=fetched.status_code,
            error_class=None,
            retry_after=fetched.headers.get("Retry-After"),
            policy=retry_policy,
            now=decided.at,
            rng=rng,
        )
        if decision.outcome != "succeeded":
            paused_until = domain_pause_until(
                fetched.status_code,
                fetched.headers.get("Retry-After"),
                retry_policy,
                decided.at,
            )
            # The host that answered is paused: after a redirect, the hop's, not the job's.
            answered_by = urlsplit(fetched.final_url).hostname or job.domain
            return _decided(
                job,
                decision,
                decided,
                fetched.status_code,
                elapsed_ms(),
                paused_until,
                answered_by,
            )
        if flight.should_stop():  # a lease in doubt included: its result is not stored
            return _stopped(flight, elapsed_ms(), decided, retry_policy.max_attempts)
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
        duration_ms=elapsed_ms(),
        result_key=stored.key,
        result_size=stored.size,
        result_sha256=stored.sha256,
        result_content_type=stored.content_type,
    )


def _storable_content_type(value: str | None) -> str | None:
    """The target's Content-Type when it is a sane header value; junk is dropped (the store
    then records application/octet-stream) rather than failing a fetched job."""
    if value is None or len(value) > 255 or not value.isascii() or not value.isprintable():
        return None
    return value


@dataclass(frozen=True)
class _Decided:
    """When an outcome was decided: the wall clock its times were computed with, and the
    monotonic clock beside it. The round that writes the outcome turns its times into
    delays from this reading, not from the wall clock at the write: a clock stepped (or
    an outcome held through a database outage) in between must not move them."""

    at: datetime
    monotonic: float

    @classmethod
    def now(cls, clock: Callable[[], datetime]) -> _Decided:
        return cls(clock(), time.monotonic())


def _decided(
    job: ClaimedJob,
    decision: Decision,
    decided: _Decided,
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


def _stopped(
    flight: _Flight, duration_ms: int, decided: _Decided, max_attempts: int
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


def _retry_now(job: ClaimedJob, error_class: str, detail: str, decided: _Decided) -> AttemptOutcome:
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


def _drain(
    outcomes: queue.Queue[tuple[AttemptOutcome, datetime]],
    unwritten: list[tuple[AttemptOutcome, datetime]],
) -> None:
    while True:
        try:
            unwritten.append(outcomes.get_nowait())
        except queue.Empty:
            return


def _try_write(
    engine: Engine,
    worker: str,
    store: ResultStore,
    unwritten: list[tuple[AttemptOutcome, datetime]],
    report: WorkerReport,
    clock: Callable[[], datetime],
    database: _Backoff,
    max_pause_seconds: float,
) -> bool:
    """Write the outcomes owed (one transaction); True when written. On a database error
    they stay in `unwritten` for the next try."""
    try:
        written = repository.finish_attempts(
            engine,
            worker=worker,
            outcomes=[o for o, _ in unwritten],
            clock=clock,
            max_pause_seconds=max_pause_seconds,
        )
        refused = [o for o, _ in unwritten if o.job_id not in written]
        # A refusal may be our own earlier write whose commit was acknowledged too late
        # (the connection cut after COMMIT): the attempt row tells.
        landed = repository.attempts_written(engine, [(o.job_id, o.attempt) for o in refused])
    except Exception as exc:
        database.failed(f"writing {len(unwritten)} outcomes", exc)
        return False
    database.succeeded()
    batch, unwritten[:] = list(unwritten), []
    unwanted: list[str] = []
    for outcome, created_at in batch:
        status = written.get(outcome.job_id)
        if status is None and (outcome.job_id, outcome.attempt) in landed:
            status = landed[outcome.job_id, outcome.attempt]
        if status is None:
            report.lease_lost += 1
            if outcome.result_key is not None:
                unwanted.append(outcome.result_key)
            continue
        day = report.day(created_at.astimezone(UTC).date())
        if status == "succeeded":
            report.succeeded += 1
            day.jobs_stored += 1
            day.bytes += outcome.result_size or 0
        elif status == "queued":
            report.retried += 1
        elif status == "failed":
            report.failed += 1
            day.failures_by_class[outcome.error_class or "unknown"] += 1
        elif status == "cancelled":
            report.cancelled += 1
            if outcome.result_key is not None:  # fetched, then overruled by the cancel
                unwanted.append(outcome.result_key)
    if unwanted:
        try:
            store.delete_many(unwanted)
        except Exception:
            log.exception(
                "deleting %d unwanted result objects failed; pin-retention deletes them",
                len(unwanted),
            )
    return True


def _renew_leases_until(
    engine: Engine,
    worker: str,
    lease_seconds: float,
    flights: dict[tuple[uuid.UUID, int], _Flight],
    flights_lock: threading.Lock,
    done: threading.Event,
) -> None:
    # Three renewals per lease: one slow round trip does not cost the lease. A failed one is
    # tried again sooner, with backoff, so the lease is back as soon as the database is.
    interval = lease_seconds / 3
    wait = interval
    failures = 0
    while not done.wait(wait):
        wait = interval
        with flights_lock:
            keys = list(flights)
        if not keys:
            continue
        # The lease runs from when the renewal was sent, not from when its answer came.
        sent_at = time.monotonic()
        try:
            held = repository.renew_leases(
                engine, worker=worker, attempts=keys, lease_seconds=lease_seconds
            )
        except Exception as exc:
            wait = min(DB_RETRY_FIRST_SECONDS * 2**failures, interval)
            failures += 1
            log.warning("lease renewal failed (%s); retrying in %.2f s", exc, wait)
            continue
        failures = 0
        with flights_lock:
            for key in keys:
                flight = flights.get(key)
                if flight is None:
                    continue
                if key not in held:
                    flight.stop("lease_lost")
                    continue
                flight.renewed_at = sent_at
                if held[key]:
                    flight.stop("cancelled")
