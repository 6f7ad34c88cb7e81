"""A worker run: claim due jobs with a lease, fetch them in bounded slots, store results,
record outcomes (SCR-3, SCR-5, SCR-6, SCR-10).

One run drains many jobs (a Dagster run costs seconds to launch). The main loop owns the
database: each round it writes the outcomes the slots produced (one transaction for the
round; one statement in autocommit for one host's jobs done), then claims as many due jobs
as there are free slots (one statement, in autocommit). Slot
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

import contextlib
import gc
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.fetch.robots import RobotsGuard
from pin_orchestration.scraping.store import leases
from pin_orchestration.scraping.store.leases import AttemptOutcome, ClaimedJob, DomainDefaults
from pin_orchestration.scraping.store.results import ResultStore
from pin_orchestration.scraping.worker.attempt import Decided, Flight, attempt, decided_outcome
from pin_orchestration.scraping.worker.backoff import (
    DB_RETRY_FIRST_SECONDS,
    MAX_POLL_SECONDS,
    DatabaseBackoff,
)
from pin_orchestration.scraping.worker.options import WorkerOptions
from pin_orchestration.scraping.worker.outcomes import WorkerReport, drain_outcomes, write_outcomes
from pin_orchestration.scraping.worker.retry import RetryPolicy, decide

log = logging.getLogger(__name__)

# How long a stopping run keeps trying to write its outcomes to an unreachable database,
# at least (a lease's length when longer: past it the jobs are the sweeper's anyway).
FINAL_WRITE_MIN_SECONDS = 30.0

_q = NamedQueries("pin_orchestration.scraping", "queries.sql")


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
    # One statement, atomic by itself: in autocommit, no BEGIN and COMMIT round trips (each
    # a wait for the GIL in a worker whose slots just ended a round), and its row locks go
    # as it ends rather than when a COMMIT comes.
    with leases.autocommit(engine) as conn:
        rows = conn.execute(
            _q("claim_due_jobs"),
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
    lease_clock: Callable[[], float] = time.monotonic,
    renew_every_seconds: float | None = None,
) -> WorkerReport:
    """Drain due jobs until nothing is claimable for `idle_exit_seconds`, the max duration
    passes, or `stop` is set; jobs in flight finish (or are handed back) before returning.

    `claim` is the pick; the FIFO baseline of bench/noisy_neighbour.py passes its own.
    `clock` is the wall clock retries and pauses are decided with (the fault suite jumps
    it); they reach the database as delays, so its skew does not move them.
    `lease_clock` (monotonic seconds) is what the run judges its leases by: when a claim or
    renewal was sent, and so when a lease no renewal confirmed is in doubt. Renewals (and
    the cancel requests they bring back) come every `renew_every_seconds`, a third of the
    lease by default. The tests set both: a lease long enough that a starved machine cannot
    lose it, renewals as often as a short one's, and its doubt moved by the test's clock."""
    options.validate()
    return WorkerRun(
        engine,
        store,
        fetcher,
        retry_policy,
        options,
        worker=worker_id or f"worker-{uuid.uuid4()}",
        stop=stop or threading.Event(),
        rng=rng or random.Random(),
        on_round=on_round,
        claim=claim,
        clock=clock,
        lease_clock=lease_clock,
        renew_every_seconds=renew_every_seconds,
    ).run()


class WorkerRun:
    """One run: its main loop (write the outcomes owed, claim into free slots, wait), the
    slots' attempts, and what they share — the jobs in flight, the outcomes not yet
    written, the database's backoff and the report."""

    def __init__(
        self,
        engine: Engine,
        store: ResultStore,
        fetcher: Fetcher,
        retry_policy: RetryPolicy,
        options: WorkerOptions,
        *,
        worker: str,
        stop: threading.Event,
        rng: random.Random,
        on_round: Callable[[WorkerReport], None] | None,
        claim: ClaimFn,
        clock: Callable[[], datetime],
        lease_clock: Callable[[], float] = time.monotonic,
        renew_every_seconds: float | None = None,
    ) -> None:
        self.engine, self.store, self.fetcher = engine, store, fetcher
        self.retry_policy, self.options = retry_policy, options
        self.worker, self.stop, self.rng, self.clock = worker, stop, rng, clock
        self.lease_clock = lease_clock
        self.renew_every_seconds = renew_every_seconds or options.lease_seconds / 3
        self.on_round, self.claim = on_round, claim
        self.report = WorkerReport(worker=worker)
        # Keyed by (job, attempt): a run may claim its own swept job again while the old
        # attempt's slot still runs, and the two must not share an entry (the old slot's end
        # would drop the new attempt, whose lease would then go unrenewed).
        self.flights: dict[tuple[uuid.UUID, int], Flight] = {}
        self.flights_lock = threading.Lock()
        self.outcomes: queue.Queue[tuple[AttemptOutcome, datetime]] = queue.Queue()
        # Outcomes taken from the queue and not yet written (the database unreachable).
        self.unwritten: list[tuple[AttemptOutcome, datetime]] = []
        self.database = DatabaseBackoff()
        # Set by a slot that finished: the loop looks for due jobs at once.
        self.wake = threading.Event()
        self.robots = RobotsGuard(
            engine,
            fetcher,
            mode=options.robots,
            owner=worker,
            domain_defaults=options.domain_defaults,
            retry_seconds=options.robots_retry_seconds,
            max_pause_seconds=retry_policy.max_pause_seconds,
            clock=clock,
        )

    def run(self) -> WorkerReport:
        with _heap_frozen():
            return self._run()

    def _run(self) -> WorkerReport:
        renewal_done = threading.Event()
        renewer = threading.Thread(
            target=renew_leases_until,
            args=(
                self.engine,
                self.worker,
                self.options.lease_seconds,
                self.flights,
                self.flights_lock,
                renewal_done,
                self.renew_every_seconds,
                self.lease_clock,
            ),
            name=f"{self.worker}-lease-renewal",
            daemon=True,
        )
        renewer.start()
        try:
            with ThreadPoolExecutor(
                max_workers=self.options.slots, thread_name_prefix=self.worker
            ) as pool:
                self._loop(pool)
                if self.stop.is_set():
                    self._stop_flights()
            # The pool has drained: every slot's outcome is queued. They are written before
            # the run ends, through a database outage of up to a lease's length.
            self._write_before_exit()
        finally:
            renewal_done.set()
            renewer.join(timeout=5)
            self.robots.close()
        return self.report

    def _loop(self, pool: ThreadPoolExecutor) -> None:
        started = time.monotonic()
        idle_since: float | None = None
        empty_claims = 0
        while True:
            self._write_owed()
            now = time.monotonic()
            if self.stop.is_set() or now - started >= self.options.max_run_duration_seconds:
                return
            free = self._free_slots()
            claimed, in_flight = self._claim_into_slots(free, pool)
            # Idle: nothing in flight and nothing owed to the database (an unreachable
            # database with nothing to hand over also ends the run: nothing is lost).
            if in_flight == 0 and not self.unwritten:
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= self.options.idle_exit_seconds:
                    return
            else:
                idle_since = None
            if self.on_round is not None:
                self.on_round(self.report)
            empty_claims = empty_claims + 1 if free > 0 and not claimed else 0
            self._wait_for_a_slot_or_due_jobs(empty_claims)

    def _write_owed(self) -> None:
        drain_outcomes(self.outcomes, self.unwritten)
        if self.unwritten and self.database.due():
            self._write()

    def _write(self) -> bool:
        return write_outcomes(
            self.engine,
            self.worker,
            self.store,
            self.unwritten,
            self.report,
            self.clock,
            self.database,
            self.retry_policy.max_pause_seconds,
        )

    def _free_slots(self) -> int:
        with self.flights_lock:
            return self.options.slots - len(self.flights)

    def _claim_into_slots(
        self, free: int, pool: ThreadPoolExecutor
    ) -> tuple[list[ClaimedJob], int]:
        """Claim up to `free` due jobs and start each in a slot; the jobs claimed and how
        many were in flight then."""
        claimed: list[ClaimedJob] = []
        claim_sent_at = self.lease_clock()
        if free > 0 and self.database.due():
            try:
                claimed = self.claim(
                    self.engine,
                    worker=self.worker,
                    limit=free,
                    lease_seconds=self.options.lease_seconds,
                    domain_defaults=self.options.domain_defaults,
                )
                self.database.succeeded()
            except Exception as exc:
                self.database.failed("claim", exc)
        self.report.claimed += len(claimed)
        with self.flights_lock:
            new = [
                Flight(job, self.options.lease_seconds, claim_sent_at, self.lease_clock)
                for job in claimed
            ]
            for flight in new:
                self.flights[flight.key] = flight
            in_flight = len(self.flights)
        self.report.peak_in_flight = max(self.report.peak_in_flight, in_flight)
        for flight in new:
            pool.submit(self._process, flight)
        return claimed, in_flight

    def _wait_for_a_slot_or_due_jobs(self, empty_claims: int) -> None:
        # A full pool waits for a slot; a pool with room looks again soon — later and later
        # while claims come back empty (every due job's domain is at its limit: asking again
        # at once only holds the claim lock), but at once when a job of ours finishes, since
        # that frees a connection of its domain.
        wait = min(self.options.poll_seconds * 2 ** min(empty_claims, 10), MAX_POLL_SECONDS)
        self.wake.wait(min(wait, self.database.wait_seconds()))
        self.wake.clear()

    def _stop_flights(self) -> None:
        with self.flights_lock:
            for flight in self.flights.values():
                flight.stop("worker_stopped")

    def _write_before_exit(self) -> None:
        drain_outcomes(self.outcomes, self.unwritten)
        deadline = time.monotonic() + max(self.options.lease_seconds, FINAL_WRITE_MIN_SECONDS)
        while self.unwritten:
            self.database.sleep_until_due()
            if self._write():
                return
            if time.monotonic() >= deadline:
                log.error(
                    "%d outcomes could not be written (database unreachable); the sweeper "
                    "requeues their jobs when their leases run out",
                    len(self.unwritten),
                )
                return

    def _process(self, flight: Flight) -> None:
        """A slot: one attempt, its outcome queued for the main loop, the slot freed."""
        try:
            outcome = self._attempt(flight)
        except Exception as exc:
            # A bug, or a results store that fails: must not strand the job in running, and
            # must not requeue it at once either (a cause that persists would retry it for
            # ever): a transient attempt, with the job's budget and backoff.
            log.exception("attempt of job %s failed unexpectedly", flight.job.id)
            outcome = self._worker_error(flight, exc)
        if outcome is not None:
            self.outcomes.put((outcome, flight.job.created_at))
        with self.flights_lock:
            self.flights.pop(flight.key, None)
        self.wake.set()

    def _attempt(self, flight: Flight) -> AttemptOutcome | None:
        slots = leases.RedirectSlots(
            self.engine,
            flight.job,
            hold_seconds=flight.job.timeout_seconds or self.fetcher.policy.timeout_seconds,
            domain_defaults=self.options.domain_defaults,
        )
        return attempt(
            flight,
            self.store,
            self.fetcher,
            slots,
            self.retry_policy,
            self.rng,
            self.clock,
            self.robots,
        )

    def _worker_error(self, flight: Flight, exc: Exception) -> AttemptOutcome:
        decided = Decided.now(self.clock)
        decision = decide(
            attempt=flight.job.budget_used,
            status_code=None,
            error_class="worker_error",
            error_detail=f"{type(exc).__name__}: {exc}",
            retry_after=None,
            policy=self.retry_policy,
            now=decided.at,
            rng=self.rng,
        )
        return decided_outcome(flight.job, decision, decided, None, None)


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """The objects alive when the run starts (modules, Dagster's definitions, the engine)
    are moved out of the cyclic collector's sight for the run: its full passes then walk
    what the run allocated, not the whole heap again (~12% of a worker's CPU, every few
    hundred jobs). Unfrozen when the run ends, so what became garbage meanwhile is collected
    then. A heap already frozen (by the process, before forking) is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def renew_leases_until(
    engine: Engine,
    worker: str,
    lease_seconds: float,
    flights: dict[tuple[uuid.UUID, int], Flight],
    flights_lock: threading.Lock,
    done: threading.Event,
    interval: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    # Three renewals per lease (`interval`): one slow round trip does not cost the lease. A
    # failed one is tried again sooner, with backoff, so the lease is back as soon as the
    # database is.
    interval = interval or lease_seconds / 3
    wait = interval
    failures = 0
    while not done.wait(wait):
        wait = interval
        with flights_lock:
            keys = list(flights)
        if not keys:
            continue
        # The lease runs from when the renewal was sent, not from when its answer came.
        sent_at = clock()
        try:
            held = leases.renew_leases(
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
