"""A model of what the scraping service promises (issue 30), checked against real PostgreSQL
by a Hypothesis state machine: jobs submitted (one, a batch, SQL), claimed by two workers
on their own connections (one after the other, or both at once), finished (success,
transient, permanent, 429 with any Retry-After), swept, cancelled, requeued; domains
paused and resumed; tenant weights changed; the clock moved. After every step:

- no job is claimed twice at once (a claim never returns a job in flight; one open
  attempt per job);
- a job's attempts since its last requeue never pass max_attempts;
- a domain's limits hold: its running jobs never pass its concurrency, its starts never
  pass its token bucket (rate × time + one second's worth);
- a pause is never shortened, except by resume;
- fairness by jobs started: over one claim, two tenants with claimable work in a class
  throughout it start jobs within one job of their weights' shares, counted from the start
  tags the claim began with (|n_a/w_a - n_b/w_b| <= 1/w_a + 1/w_b, the start-time fair
  queuing bound, plus any gap between their tags that claims at once left: `_check_fair`);
- exactly one result object per succeeded job, none for any other;
- the scheduler's own structure: every queued job has its domain queue, its tenant's flow
  there and its tenant's row in its class, and no tenant is parked with a flow ready.
And once the world is quiet (pauses lifted, time moved past every wait, workers
finishing what they hold), every job reaches a terminal state.

The clock: PostgreSQL's is the only clock the scheduler reads (the worker writes delays
from it). Moving time forward by s seconds is moving every stored moment the scheduler
compares with now() back by s (`ScrapingModel.step_clock`): the same world, s seconds
later. The model keeps its own record of moments in that shifted frame (`virtual`).

Used by tests/scraping/test_state_machine.py (seeded, a few hundred steps) and by
bench/scraping_model.py (`--seed N --steps M`, as long as you like).
"""

from __future__ import annotations

import hashlib
import io
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import Engine, text

from pin_orchestration.scraping.store import leases, politeness, repository, tenancy
from pin_orchestration.scraping.store.leases import ClaimedJob, DomainDefaults
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.politeness import set_domain_limits
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.store.results import META_SUFFIX, result_key
from pin_orchestration.scraping.store.tenancy import create_tenant
from pin_orchestration.scraping.worker.attempt import Decided, decided_outcome
from pin_orchestration.scraping.worker.backoff import DatabaseBackoff
from pin_orchestration.scraping.worker.outcomes import WorkerReport, write_outcomes
from pin_orchestration.scraping.worker.retry import RetryPolicy, decide, domain_pause_until
from pin_orchestration.scraping.worker.run import claim_due_jobs

MAX_ATTEMPTS = 3
LEASE_SECONDS = 30.0
MAX_PAUSE_SECONDS = 3600.0
# Open domains: limits that never bind, so claimable work there is claimable all through a
# claim (the fairness check counts on it). The tight one binds both limits.
OPEN = ("open-a.example", "open-b.example")
TIGHT = "tight.example"
TIGHT_RPS = 2.0
TIGHT_CONCURRENCY = 1
DOMAINS = (*OPEN, TIGHT)
DEFAULTS = DomainDefaults(rps=10_000.0, concurrency=10_000)
PRIORITIES = ("high", "normal", "low")
WORKERS = ("w1", "w2")
POLICY = RetryPolicy(
    max_attempts=MAX_ATTEMPTS,
    backoff_base_seconds=1.0,
    backoff_cap_seconds=20.0,
    max_pause_seconds=MAX_PAUSE_SECONDS,
)
# Far-future values included: a job's retry is capped like the domain's pause, so even
# `Retry-After: Fri, 31 Dec 9999 …` leaves the job due within PIN_SCRAPING_MAX_PAUSE_SECONDS.
RETRY_AFTERS = (
    None,
    "0",
    "1",
    "30",
    "soon",
    "Thu, 01 Jan 1970 00:00:00 GMT",
    "999999",
    "Fri, 31 Dec 9999 23:59:59 GMT",
)

# Every stored moment the scheduler compares with now(): moved back to move time forward.
CLOCK_COLUMNS = {
    "scraping.jobs": ("next_attempt_at", "lease_expires_at"),
    "scraping.domains": ("blocked_until", "tokens_at"),
    "scraping.domain_queues": ("wake_at",),
    "scraping.tenant_flows": ("wake_at",),
    "scraping.redirect_slots": ("expires_at",),
}
RESET = (
    "TRUNCATE scraping.job_attempts, scraping.jobs, scraping.domain_queues, "
    "scraping.tenant_flows, scraping.tenant_queues, scraping.domains, scraping.tenant_vtimes, "
    "scraping.intake_buckets, scraping.webhook_deliveries, scraping.redirect_slots, "
    "scraping.tenants CASCADE; "
    "UPDATE scraping.pick_classes SET vtime = 0, last_start = 0; "
    "UPDATE scraping.pick_class_clocks SET tenant_clock = '{0,0,0}', exact_start_clock = '{0,0,0}'"
)
EPSILON = 1e-6


@dataclass
class Flight:
    """A job a model worker holds: claimed, not yet finished."""

    worker: str
    job: ClaimedJob


class ModelViolation(AssertionError):
    """A promise broken; the message says which, with what the model saw."""


class ScrapingModel(RuleBasedStateMachine):
    """Set `engine`, `workers` (one engine per worker name, their own connections) and
    `store_root` on a subclass before running it."""

    engine: ClassVar[Engine]
    workers: ClassVar[dict[str, Engine]]
    store_root: ClassVar[Path]
    # what the runs did, over every example (bench/scraping_model.py prints it)
    stats: ClassVar[Counter[str]]
    retry_afters: ClassVar[tuple[str | None, ...]] = RETRY_AFTERS
    # off only when asked (bench/scraping_model.py --skip-fairness)
    check_fairness: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        with self.engine.begin() as conn:
            conn.exec_driver_sql(RESET)
        for path in (
            sorted(self.store_root.rglob("*"), reverse=True) if self.store_root.exists() else []
        ):
            path.unlink() if path.is_file() else path.rmdir()
        self.store = LocalResultStore(
            self.store_root,
            public_base_url="http://testserver",
            signing_key=b"scraping-model-signing-key",
        )
        self.tenants = [create_tenant(self.engine, f"t{i}")[0] for i in range(3)]
        set_domain_limits(self.engine, TIGHT, rps=TIGHT_RPS, concurrency=TIGHT_CONCURRENCY)
        self.shift = 0.0  # seconds the world has been moved forward
        self.flights: dict[uuid.UUID, Flight] = {}
        self.stale: list[Flight] = []  # attempts whose lease was swept from under them
        self.tight_starts: list[float] = []  # virtual epoch seconds
        self.pause_floor: dict[str, float] = {}  # domain -> pause granted (virtual epoch)
        self.jobs: list[tuple[uuid.UUID, uuid.UUID]] = []  # (tenant, job)
        self.n = 0
        self.rng = random.Random(0)
        self.overlapped = False  # claim_both_at_once has run in this history
        self.reweighted: set[uuid.UUID] = set()  # tenants whose weight set_weight changed

    # --- the clock ------------------------------------------------------------------

    def db_now(self) -> datetime:
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT clock_timestamp()")).scalar_one()

    def virtual(self, moment: datetime) -> float:
        return moment.timestamp() + self.shift

    @rule(seconds=st.sampled_from([0.3, 1.0, 5.0, 40.0, 4000.0]))
    def step_clock(self, seconds: float) -> None:
        with self.engine.begin() as conn:
            for table, columns in CLOCK_COLUMNS.items():
                sets = ", ".join(f"{c} = {c} - make_interval(secs => :s)" for c in columns)
                conn.execute(text(f"UPDATE {table} SET {sets}"), {"s": seconds})
        self.shift += seconds

    # --- intake -----------------------------------------------------------------------

    def _request(self, domain: str, priority: str) -> JobRequest:
        self.n += 1
        return JobRequest(url=f"http://{domain}/{self.n}", params={"n": self.n}, priority=priority)

    @initialize(
        backlog=st.lists(
            st.tuples(st.integers(0, 2), st.sampled_from(DOMAINS), st.sampled_from(PRIORITIES)),
            min_size=20,
            max_size=80,
        )
    )
    def backlog(self, backlog: list[tuple[int, str, str]]) -> None:
        """Every history starts with work queued by the three tenants (tenants competing
        for the claims is what the fairness check needs)."""
        for t in range(3):
            mine = [(d, p) for who, d, p in backlog if who == t]
            if mine:
                self.submit_batch(t, mine)

    @rule(
        t=st.integers(0, 2), domain=st.sampled_from(DOMAINS), priority=st.sampled_from(PRIORITIES)
    )
    def submit(self, t: int, domain: str, priority: str) -> None:
        tenant = self.tenants[t].id
        job = repository.submit_job(self.engine, tenant, self._request(domain, priority), None)
        self.jobs.append((tenant, job.id))

    @rule(
        t=st.integers(0, 2),
        batch=st.lists(
            st.tuples(st.sampled_from(DOMAINS), st.sampled_from(PRIORITIES)),
            min_size=1,
            max_size=8,
        ),
    )
    def submit_batch(self, t: int, batch: list[tuple[str, str]]) -> None:
        tenant = self.tenants[t].id
        with self.engine.begin() as conn:
            answers = repository.submit_jobs(
                conn, tenant, [(self._request(d, p), None) for d, p in batch], atomic=False
            )
        self.jobs.extend((tenant, a.id) for a in answers)  # type: ignore[union-attr]

    @rule(
        t=st.integers(0, 2), domain=st.sampled_from(DOMAINS), priority=st.sampled_from(PRIORITIES)
    )
    def submit_sql(self, t: int, domain: str, priority: str) -> None:
        tenant = self.tenants[t].id
        request = self._request(domain, priority)
        with self.engine.begin() as conn:
            job_id = conn.execute(
                text("SELECT scraping.submit_job(:t, :url, '{}'::jsonb, :p)"),
                {"t": tenant, "url": request.url, "p": priority},
            ).scalar_one()
        self.jobs.append((tenant, job_id))

    # --- claims -----------------------------------------------------------------------

    def _claim(self, name: str, limit: int) -> list[ClaimedJob]:
        return claim_due_jobs(
            self.workers[name],
            worker=name,
            limit=limit,
            lease_seconds=LEASE_SECONDS,
            domain_defaults=DEFAULTS,
        )

    def _took(self, name: str, claimed: list[ClaimedJob]) -> None:
        self.stats["claims"] += 1
        self.stats["jobs started"] += len(claimed)
        for job in claimed:
            held = self.flights.get(job.id)
            if held is not None:
                raise ModelViolation(
                    f"job {job.id} claimed by {name} while {held.worker} holds it"
                    f" (attempt {held.job.attempt}, now {job.attempt})"
                )
            self.flights[job.id] = Flight(name, job)
        tight = [j for j in claimed if j.domain == TIGHT]
        if tight:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT a.started_at FROM scraping.job_attempts a"
                        " JOIN unnest(CAST(:ids AS uuid[]), CAST(:n AS int[])) AS u(id, n)"
                        "   ON a.job_id = u.id AND a.number = u.n"
                    ),
                    {"ids": [str(j.id) for j in tight], "n": [j.attempt for j in tight]},
                ).all()
            self.tight_starts.extend(self.virtual(r.started_at) for r in rows)

    @rule(name=st.sampled_from(WORKERS), limit=st.integers(1, 8))
    def claim(self, name: str, limit: int) -> None:
        """One claim alone: the fairness bound is checked over it."""
        began = self.db_now()
        weights = self._weights()
        tags = self._start_tags()
        claimed = self._claim(name, limit)
        self._took(name, claimed)
        self._check_fair(claimed, began, weights, tags)

    @rule(limits=st.tuples(st.integers(1, 8), st.integers(1, 8)))
    def claim_both_at_once(self, limits: tuple[int, int]) -> None:
        """Both workers claim at the same moment (a gate), each on its own connection."""
        gate = threading.Barrier(2)
        got: dict[str, list[ClaimedJob]] = {}
        errors: list[BaseException] = []

        def run(name: str, limit: int) -> None:
            try:
                gate.wait()
                got[name] = self._claim(name, limit)
            except BaseException as exc:  # reported on the main thread
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(n, lim))
            for n, lim in zip(WORKERS, limits, strict=True)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.overlapped = True
        if errors:
            raise errors[0]
        both = {j.id for j in got[WORKERS[0]]} & {j.id for j in got[WORKERS[1]]}
        if both:
            raise ModelViolation(f"jobs claimed by both workers at once: {sorted(both)}")
        for name in WORKERS:
            self._took(name, got[name])

    def _weights(self) -> dict[uuid.UUID, float]:
        with self.engine.connect() as conn:
            return {
                r.id: r.weight
                for r in conn.execute(text("SELECT id, weight FROM scraping.tenants"))
            }

    def _start_tags(self) -> dict[tuple[str, uuid.UUID], Decimal]:
        """Each (class, tenant)'s start tag as the next claim finds it: a parked tenant's
        comes back at its class's start clock if that is later (claim_jobs.sql). Start tags
        are numeric (exact, migration 0046): psycopg reads them as Decimal."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.priority, t.tenant_id, CASE WHEN t.ready THEN t.start_tag"
                    " ELSE greatest(t.start_tag, c.start_clock) END AS tag"
                    " FROM scraping.tenant_queues t"
                    " JOIN scraping.class_clocks c ON c.priority = t.priority"
                )
            ).all()
        return {(r.priority, r.tenant_id): r.tag for r in rows}

    def _check_fair(
        self,
        claimed: list[ClaimedJob],
        began: datetime,
        weights: dict[uuid.UUID, float],
        tags: dict[tuple[str, uuid.UUID], Decimal],
    ) -> None:
        """Tenants with claimable work on an open domain all through the claim (due before
        it began, not paused, no cancel asked, still queued after it): within a class, their
        starts in this claim keep the start-time fair queuing bound from the start tags the
        claim began with.

        Not the bound alone (|n_a/w_a - n_b/w_b| <= 1/w_a + 1/w_b): that holds from tags
        within a turn of each other, and claims at once do not leave them so. Each
        continues from the tags last committed, and a tenant one claim holds is skipped by
        the other, so B (held by a claim of 3) may end 5 turns behind C (served by a claim
        of 8) though claimable throughout; the next claim alone then serves B until its tag
        reaches C's, past the bound in that claim, and that catch-up is what makes the
        tenants even by jobs started (tests/scraping/test_fairness_blocked.py, "catches
        up"; the hunt's seed 7 flagged it). So the gap a claim begins with, S_b - S_a, is
        A's to take: n_a/w_a - n_b/w_b <= max(0, S_b - S_a) + 1/w_a + 1/w_b. Tags wrongly
        set (a parked tenant brought back behind the clock) are checked by those tests,
        not here."""
        if not self.check_fairness:
            return
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT DISTINCT j.priority, j.tenant_id FROM scraping.jobs j"
                    " LEFT JOIN scraping.domains d ON d.domain = j.domain"
                    " WHERE j.status = 'queued' AND j.domain = ANY(:open)"
                    "   AND j.next_attempt_at <= :began AND j.cancel_requested_at IS NULL"
                    "   AND (d.blocked_until IS NULL OR d.blocked_until <= :began)"
                ),
                {"open": list(OPEN), "began": began},
            ).all()
        backlogged: dict[str, list[uuid.UUID]] = {}
        for r in rows:
            backlogged.setdefault(r.priority, []).append(r.tenant_id)
        self.stats["tenant pairs checked for fairness"] += sum(
            len(t) * (len(t) - 1) // 2 for t in backlogged.values()
        )
        for priority, tenants in backlogged.items():
            n = {
                t: sum(1 for j in claimed if j.priority == priority and j.tenant_id == t)
                for t in tenants
            }
            for a in tenants:
                for b in tenants:
                    wa, wb = weights[a], weights[b]
                    lag = n[a] / wa - n[b] / wb
                    sa = tags.get((priority, a), Decimal(0))
                    sb = tags.get((priority, b), Decimal(0))
                    # the gap exact, then a float like the rest of the bound
                    gap = float(max(Decimal(0), sb - sa))
                    if lag > 1 / wa + 1 / wb + EPSILON:
                        # past the bound from level tags: a catch-up (if within the gap)
                        self.stats[
                            "claims catching a tenant up past the level bound"
                            + (
                                " (after claims at once)"
                                if self.overlapped
                                else " (after a weight change of either)"
                                if {a, b} & self.reweighted
                                else " (neither before: look)"
                            )
                        ] += 1
                    if lag > gap + 1 / wa + 1 / wb + EPSILON:
                        raise ModelViolation(
                            f"unfair claim in class {priority}: tenant {a} (weight {wa},"
                            f" start tag {sa}) started {n[a]}, tenant {b} (weight {wb}, start"
                            f" tag {sb}) {n[b]}, both claimable throughout; picks"
                            f" {[(j.tenant_id, j.priority, j.domain) for j in claimed]}"
                        )

    # --- outcomes ---------------------------------------------------------------------

    def _write(self, flight: Flight, outcome: leases.AttemptOutcome) -> None:
        """Through the worker's own write path (worker.outcomes.write_outcomes): finish in one
        transaction, delete the object of a refused or overruled success."""
        report = WorkerReport(worker=flight.worker)
        unwritten = [(outcome, flight.job.created_at)]
        ok = write_outcomes(
            self.workers[flight.worker],
            flight.worker,
            self.store,
            unwritten,
            report,
            lambda: datetime.now(UTC),
            DatabaseBackoff(),
            MAX_PAUSE_SECONDS,
        )
        assert ok, "the outcome write failed"

    def _success(self, flight: Flight) -> leases.AttemptOutcome:
        job = flight.job
        body = f"body of {job.id} attempt {job.attempt}".encode()
        stored = self.store.put(
            result_key(job.tenant_id, job.id, job.created_at, job.attempt),
            io.BytesIO(body),
            size=len(body),
            sha256=hashlib.sha256(body).hexdigest(),
            content_type="text/plain",
        )
        return leases.AttemptOutcome(
            job_id=job.id,
            attempt=job.attempt,
            status="succeeded",
            outcome="succeeded",
            http_status=200,
            duration_ms=1,
            result_key=stored.key,
            result_size=stored.size,
            result_sha256=stored.sha256,
            result_content_type=stored.content_type,
        )

    def _answered(
        self, flight: Flight, status: int, retry_after: str | None
    ) -> leases.AttemptOutcome:
        now = datetime.now(UTC)
        job = flight.job
        decision = decide(
            attempt=job.budget_used,
            status_code=status,
            error_class=None,
            retry_after=retry_after,
            policy=POLICY,
            now=now,
            rng=self.rng,
        )
        paused = domain_pause_until(status, retry_after, POLICY, now)
        decided = Decided(now, time.monotonic())
        return decided_outcome(job, decision, decided, status, 1, paused, job.domain)

    @precondition(lambda self: bool(self.flights))
    @rule(
        pick=st.integers(0, 10_000),
        kind=st.sampled_from(["success", "success", "transient", "permanent", "429"]),
        retry_after=st.integers(0, 10_000),
    )
    def finish(self, pick: int, kind: str, retry_after: int) -> None:
        # Indexes drawn whatever the database answered, so a replayed history draws the
        # same (the jobs in flight depend on claims, which depend on timing).
        job_id = sorted(self.flights)[pick % len(self.flights)]
        flight = self.flights.pop(job_id)
        header = self.retry_afters[retry_after % len(self.retry_afters)]
        if kind == "success":
            outcome = self._success(flight)
        elif kind == "transient":
            outcome = self._answered(flight, 503, None)
        elif kind == "permanent":
            outcome = self._answered(flight, 404, None)
        else:
            outcome = self._answered(flight, 429, header)
        self._write(flight, outcome)
        self.stats[f"finished: {kind}"] += 1
        if outcome.domain_paused_until is not None:
            self._note_pause(outcome.domain or flight.job.domain)

    @precondition(lambda self: bool(self.stale))
    @rule(pick=st.integers(0, 10_000))
    def late_finish(self, pick: int) -> None:
        """A worker whose lease was swept comes back with a success: refused, and its object
        deleted."""
        flight = self.stale.pop(pick % len(self.stale))
        self._write(flight, self._success(flight))
        self.stats["late finishes (refused)"] += 1

    @rule()
    def sweep(self) -> None:
        swept = leases.sweep_expired_leases(self.engine, max_attempts=MAX_ATTEMPTS)
        for row in swept:
            flight = self.flights.pop(row.id, None)
            if flight is None:
                raise ModelViolation(f"swept job {row.id} that no model worker held")
            self.stale.append(flight)
            self.stats["leases swept"] += 1

    @precondition(lambda self: bool(self.jobs))
    @rule(pick=st.integers(0, 10_000))
    def cancel(self, pick: int) -> None:
        tenant, job_id = self.jobs[pick % len(self.jobs)]
        repository.cancel_job(self.engine, tenant, job_id)

    @rule()
    def requeue_failed(self) -> None:
        with self.engine.connect() as conn:
            failed = [
                r.id
                for r in conn.execute(text("SELECT id FROM scraping.jobs WHERE status = 'failed'"))
            ]
        if failed:
            leases.requeue_failed_jobs(self.engine, failed)

    # --- domains and tenants ----------------------------------------------------------

    def _note_pause(self, domain: str) -> None:
        with self.engine.connect() as conn:
            until = conn.execute(
                text("SELECT blocked_until FROM scraping.domains WHERE domain = :d"), {"d": domain}
            ).scalar_one_or_none()
        if until is not None:
            self.pause_floor[domain] = max(self.pause_floor.get(domain, 0.0), self.virtual(until))

    @rule(domain=st.sampled_from(DOMAINS), seconds=st.sampled_from([0.5, 3.0, 60.0, 10_000.0]))
    def pause(self, domain: str, seconds: float) -> None:
        before = self.db_now()
        self.stats["pauses"] += 1
        kept = politeness.pause_domain(
            self.engine, domain, seconds=seconds, max_pause_seconds=MAX_PAUSE_SECONDS
        )
        asked = self.virtual(before) + min(seconds, MAX_PAUSE_SECONDS)
        if self.virtual(kept) < asked - 0.5:
            raise ModelViolation(f"pause of {domain} for {seconds} s kept only until {kept}")
        self._note_pause(domain)

    @rule(domain=st.sampled_from(DOMAINS))
    def resume(self, domain: str) -> None:
        politeness.resume_domain(self.engine, domain)
        self.pause_floor.pop(domain, None)

    @rule(t=st.integers(0, 2), weight=st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    def set_weight(self, t: int, weight: float) -> None:
        tenancy.set_tenant_weight(self.engine, self.tenants[t].name, weight)
        self.reweighted.add(self.tenants[t].id)

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def attempts_within_budget(self) -> None:
        with self.engine.connect() as conn:
            over = conn.execute(
                text(
                    "SELECT id, attempts, attempts_before_requeue, robots_waits FROM scraping.jobs"
                    " WHERE attempts - attempts_before_requeue - robots_waits > :m"
                ),
                {"m": MAX_ATTEMPTS},
            ).all()
        if over:
            raise ModelViolation(f"jobs past max_attempts {MAX_ATTEMPTS}: {over}")

    @invariant()
    def one_open_attempt_per_running_job(self) -> None:
        with self.engine.connect() as conn:
            bad = conn.execute(
                text(
                    "SELECT j.id, j.status, count(a.*) AS open FROM scraping.jobs j"
                    " LEFT JOIN scraping.job_attempts a"
                    "   ON a.job_id = j.id AND a.finished_at IS NULL"
                    " GROUP BY j.id, j.status"
                    " HAVING count(a.*) <> CASE WHEN j.status = 'running' THEN 1 ELSE 0 END"
                )
            ).all()
        if bad:
            raise ModelViolation(f"jobs whose open attempts do not match their status: {bad}")

    @invariant()
    def domain_limits_hold(self) -> None:
        with self.engine.connect() as conn:
            running = conn.execute(
                text("SELECT count(*) FROM scraping.jobs WHERE status = 'running' AND domain = :d"),
                {"d": TIGHT},
            ).scalar_one()
        if running > TIGHT_CONCURRENCY:
            raise ModelViolation(
                f"{running} jobs running on {TIGHT} (concurrency {TIGHT_CONCURRENCY})"
            )
        starts = sorted(self.tight_starts)
        capacity = max(1.0, TIGHT_RPS)
        for i in range(len(starts)):
            for j in range(i, len(starts)):
                allowed = capacity + TIGHT_RPS * (starts[j] - starts[i])
                if j - i + 1 > allowed + EPSILON:
                    raise ModelViolation(
                        f"{j - i + 1} starts on {TIGHT} within {starts[j] - starts[i]:.3f} s"
                        f" (rate {TIGHT_RPS}/s, bucket {capacity})"
                    )

    @invariant()
    def pauses_never_shortened(self) -> None:
        with self.engine.connect() as conn:
            rows = {
                r.domain: r.blocked_until
                for r in conn.execute(text("SELECT domain, blocked_until FROM scraping.domains"))
            }
        for domain, floor in self.pause_floor.items():
            until = rows.get(domain)
            kept = self.virtual(until) if until is not None else None
            if kept is None or kept < floor - 0.001:
                raise ModelViolation(
                    f"pause of {domain} shortened: granted until {floor}, now {kept}"
                )

    @invariant()
    def one_object_per_succeeded_job(self) -> None:
        stored = (
            {
                str(p.relative_to(self.store_root))[: -len(META_SUFFIX)]
                for p in self.store_root.rglob(f"*{META_SUFFIX}")
            }
            if self.store_root.exists()
            else set()
        )
        with self.engine.connect() as conn:
            reported = {
                r.result_key
                for r in conn.execute(
                    text("SELECT result_key FROM scraping.jobs WHERE status = 'succeeded'")
                )
            }
        if None in reported:
            raise ModelViolation("a succeeded job without a result object")
        if stored != reported:
            raise ModelViolation(
                f"objects without a succeeded job: {sorted(stored - reported)};"
                f" succeeded jobs without their object: {sorted(reported - stored)}"
            )

    @invariant()
    def scheduler_structure_holds(self) -> None:
        """Every queued job is in the pick: its (domain, class) queue exists, at or below
        the job's tag, and its tenant's flow there and row in the class (migrations 0011,
        0020, 0039); no tenant is parked with a flow ready (it would never be picked)."""
        with self.engine.connect() as conn:
            bad = conn.execute(
                text(
                    "SELECT j.id, j.domain, j.priority, j.fair_tag, q.head_tag, f.head_tag,"
                    "       t.ready"
                    " FROM scraping.jobs j"
                    " LEFT JOIN scraping.domain_queues q"
                    "   ON q.domain = j.domain AND q.priority = j.priority"
                    " LEFT JOIN scraping.tenant_flows f ON f.domain = j.domain"
                    "   AND f.priority = j.priority AND f.tenant_id = j.tenant_id"
                    " LEFT JOIN scraping.tenant_queues t"
                    "   ON t.priority = j.priority AND t.tenant_id = j.tenant_id"
                    " WHERE j.status = 'queued'"
                    "   AND (q.domain IS NULL OR f.domain IS NULL OR t.tenant_id IS NULL)"
                )
            ).all()
            parked = conn.execute(
                text(
                    "SELECT t.priority, t.tenant_id FROM scraping.tenant_queues t"
                    " JOIN scraping.tenant_flows f"
                    "   ON f.priority = t.priority AND f.tenant_id = t.tenant_id"
                    " WHERE NOT t.ready AND f.ready"
                )
            ).all()
        if bad:
            raise ModelViolation(f"queued jobs outside the pick's structure: {bad[:5]}")
        if parked:
            raise ModelViolation(f"tenants parked with a flow ready: {parked[:5]}")

    # --- quiet ------------------------------------------------------------------------

    def teardown(self) -> None:
        """The world goes quiet: pauses lifted, time past every wait, the workers finish
        what they hold with success. Every job must then end terminal."""
        try:
            for domain in DOMAINS:
                politeness.resume_domain(self.engine, domain)
            self.pause_floor.clear()
            for _ in range(200):
                for flight in list(self.flights.values()):
                    self._write(flight, self._success(flight))
                self.flights.clear()
                with self.engine.connect() as conn:
                    left = conn.execute(
                        text(
                            "SELECT count(*) FROM scraping.jobs"
                            " WHERE status IN ('queued', 'running')"
                        )
                    ).scalar_one()
                if not left:
                    break
                self.step_clock(4000.0)
                for row in leases.sweep_expired_leases(self.engine, max_attempts=MAX_ATTEMPTS):
                    self.flights.pop(row.id, None)
                self.claim("w1", 12)  # alone: the fairness bound is checked over it too
            with self.engine.connect() as conn:
                stuck = conn.execute(
                    text(
                        "SELECT j.id, j.domain, j.priority, j.status, j.next_attempt_at,"
                        "       j.cancel_requested_at, q.ready, q.waiting_for, q.wake_at"
                        " FROM scraping.jobs j LEFT JOIN scraping.domain_queues q"
                        "   ON q.domain = j.domain AND q.priority = j.priority"
                        " WHERE j.status IN ('queued', 'running')"
                    )
                ).all()
            if stuck:
                raise ModelViolation(f"jobs not terminal once the world is quiet: {stuck[:5]}")
            self.one_object_per_succeeded_job()
        finally:
            super().teardown()


def machine_for(
    engine: Engine, worker_engines: dict[str, Engine], store_root: Path
) -> type[ScrapingModel]:
    """The model bound to a database and a results folder."""

    class Bound(ScrapingModel):
        pass

    Bound.engine = engine
    Bound.workers = worker_engines
    Bound.store_root = store_root
    Bound.stats = Counter()
    return Bound


__all__ = ["ModelViolation", "ScrapingModel", "machine_for"]
