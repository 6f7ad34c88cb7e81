"""Scraping against a hostile peer: one tenant's jobs fetch from, and announce their ends
to, a loopback peer answering with a corpus of malformed HTTP (`hostile_peer.CORPUS`: bad
and huge headers, absurd Content-Length, Retry-After and dates, redirect loops and host
flips, truncated, endless and dripping bodies, resets, invalid status lines), while a
well-behaved tenant's jobs go to the demo site and its webhooks to the recording receiver,
through the same workers and delivery loop.

Invariants, checked against records the service does not keep itself (the peer's log of
the requests it read, the demo site's log of what it served, the receiver's log, and a
trigger in the scenario's private database that logs every retry the moment it is planned,
with PostgreSQL's own clock):
- `every_job_ends`: every job reaches a terminal state and its webhook is closed
  (delivered or given up) — a hostile answer parks nothing and crashes nothing;
- `attempts_within_budget`: no job is attempted more than PIN_SCRAPING_MAX_ATTEMPTS
  times, no webhook sent more than PIN_WEBHOOK_MAX_ATTEMPTS times (the peer counts);
- `retried_with_backoff`: every retry of a job went through the retry planner's backoff
  — none was handed back at once by the sweeper (`lease_expired`: its worker stalled or
  died on an answer) — and the next attempt started no earlier than planned. (A planned
  retry may be written already due: full jitter draws delays near zero, and they count
  from the decision, which the write follows; so a worker that requeues at once is told
  apart by its retries exceeding the budget, `attempts_within_budget`, not here.)
- `other_tenants_unaffected`: the well-behaved tenant's jobs all succeed at their first
  attempt, each page fetched once, and each webhook is delivered once, at its first try.

The row's "longest recovery" is the longest a hostile job took from acceptance to its
webhook closed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import text

from faults.core import FaultContext, Outcome, scenario, wait_until
from faults.scenarios.scraping import TERMINAL, World, _start_loops, _world

log = logging.getLogger(__name__)

# Attempt budgets (quick, full): three attempts already show a retry's backoff twice.
MAX_ATTEMPTS = (3, 4)
WEBHOOK_MAX_ATTEMPTS = (3, 4)
# A 429's or 503's Retry-After pauses the peer's host this long at most.
MAX_PAUSE_SECONDS = 1
# The peer's own host (its 429s pause it, not the demo site's 127.0.0.1) and the second
# address it listens on, where its host flips lead.
PEER_HOST, PEER_ALIAS = "127.0.0.2", "127.0.0.3"
# A result's limit well below the gzip bomb's and the endless bodies' sizes.
MAX_RESULT_BYTES = 1_000_000
# Nothing here kills a worker, so a lease that expires means a worker stalled or died on
# an answer: long enough that a loaded machine's late renewal is not taken for one.
LEASE_SECONDS = 10
# The good tenant's webhooks are to arrive exactly once: an answer slowed past the timeout
# by a loaded machine would be sent again.
WEBHOOK_TIMEOUT_SECONDS = 2
GOOD_PAGE_MS = 50
# Requeues that skip the retry planner: the sweeper's, of a job whose worker stopped
# renewing its lease (stalled or crashed on an answer). (A worker run that stops hands
# back its claims at once too, but that is no failed attempt, and none stops here.)
AT_ONCE = frozenset({"lease_expired"})

REQUEUE_LOG = """
CREATE TABLE public.faults_requeues (
    job_id uuid NOT NULL, attempt integer NOT NULL, decided_at timestamptz NOT NULL,
    next_attempt_at timestamptz NOT NULL, error_class text
);
CREATE FUNCTION public.faults_log_requeue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- now(): the planning transaction's own time, the one a delay is counted from.
    INSERT INTO public.faults_requeues
    VALUES (NEW.id, NEW.attempts, now(), NEW.next_attempt_at, NEW.last_error_class);
    RETURN NULL;
END $$;
CREATE TRIGGER faults_requeue AFTER UPDATE ON scraping.jobs
FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status = 'queued')
EXECUTE FUNCTION public.faults_log_requeue();
"""


@scenario(
    "scraping-hostile-peer",
    job="scraping",
    fault="hostile target and webhook receiver (malformed HTTP)",
)
def hostile_peer(ctx: FaultContext) -> Outcome:
    from pin_orchestration.devstack.standins.hostile_peer import CORPUS, HostilePeer
    from pin_orchestration.scraping.store.repository import JobRequest, submit_job
    from pin_orchestration.scraping.store.tenancy import create_tenant

    outcome = Outcome(job="scraping", fault="hostile target and webhook receiver (malformed HTTP)")
    behaviours = sorted(CORPUS)
    rounds = ctx.scale(1, 3)
    with _world(ctx) as world, HostilePeer(PEER_HOST, alias=PEER_ALIAS) as peer:
        with world.engine.begin() as conn:
            conn.exec_driver_sql(REQUEUE_LOG)
        world.env.update(
            PIN_SCRAPING_ALLOWED_CIDRS=f"127.0.0.1/32,{PEER_HOST}/32,{PEER_ALIAS}/32",
            PIN_SCRAPING_MAX_ATTEMPTS=str(ctx.scale(*MAX_ATTEMPTS)),
            PIN_WEBHOOK_MAX_ATTEMPTS=str(ctx.scale(*WEBHOOK_MAX_ATTEMPTS)),
            PIN_SCRAPING_MAX_PAUSE_SECONDS=str(MAX_PAUSE_SECONDS),
            PIN_SCRAPING_MAX_RESULT_BYTES=str(MAX_RESULT_BYTES),
            PIN_SCRAPING_LEASE_SECONDS=str(LEASE_SECONDS),
            PIN_WEBHOOK_TIMEOUT_SECONDS=str(WEBHOOK_TIMEOUT_SECONDS),
        )
        hostile, _ = create_tenant(world.engine, "hostile")
        good, _ = create_tenant(world.engine, "good")
        # job name → the behaviours its page and its webhook receiver play
        plays: dict[str, tuple[str, str]] = {}
        good_jobs: dict[uuid.UUID, str] = {}
        hostile_jobs: dict[uuid.UUID, str] = {}
        for r in range(rounds):
            for i, page in enumerate(behaviours):
                # Each job's receiver plays another behaviour than its page.
                hook = behaviours[(i + 1 + r) % len(behaviours)]
                name = f"r{r}-{page}"
                plays[name] = (page, hook)
                request = JobRequest(
                    url=peer.url(page, name), params={}, callback_url=peer.url(hook, name)
                )
                job = submit_job(world.engine, hostile.id, request, None).id
                hostile_jobs[job] = name
                world.accepted.append(job)
                # A well-behaved job beside each hostile one, interleaved.
                n = len(good_jobs)
                request = JobRequest(
                    url=f"http://{world.target.address}/slow/good-{n}",
                    params={"ms": GOOD_PAGE_MS, "bytes": 1000 + n},
                    callback_url=f"http://{world.hooks.address}/hook/good-{n}",
                )
                job = submit_job(world.engine, good.id, request, None).id
                good_jobs[job] = f"/slow/good-{n}"
                world.accepted.append(job)
        began = time.monotonic()
        _start_loops(world)
        stalled = ""
        try:
            wait_until(world.done, timeout=ctx.scale(60, 180), what="every job ended and announced")
        except TimeoutError as exc:
            stalled = f"{exc} ({world.owing()})"
        log.info("hostile peer: settled after %.1f s", time.monotonic() - began)
        world.stop.set()
        ctx.stop_children()
        budgets = (ctx.scale(*MAX_ATTEMPTS), ctx.scale(*WEBHOOK_MAX_ATTEMPTS))
        _check(world, outcome, peer.seen(), plays, hostile_jobs, good_jobs, stalled, budgets)
    return outcome


def _check(
    world: World,
    outcome: Outcome,
    seen: list[Any],
    plays: dict[str, tuple[str, str]],
    hostile_jobs: dict[uuid.UUID, str],
    good_jobs: dict[uuid.UUID, str],
    stalled: str,
    budgets: tuple[int, int],
) -> None:
    max_attempts, webhook_max_attempts = budgets
    with world.engine.connect() as conn:
        jobs = {
            r.id: r
            for r in conn.execute(
                text(
                    "SELECT id, status, attempts, created_at, finished_at, finish_published_at, "
                    "last_error_class, next_attempt_at - now() AS next_in FROM scraping.jobs"
                )
            )
        }
        attempts = defaultdict(list)
        for a in conn.execute(
            text(
                "SELECT job_id, number, started_at, outcome, error_class "
                "FROM scraping.job_attempts ORDER BY job_id, number"
            )
        ):
            attempts[a.job_id].append(a)
        deliveries = defaultdict(list)
        for d in conn.execute(
            text(
                "SELECT job_id, outcome, error_class FROM scraping.webhook_deliveries "
                "ORDER BY job_id, id"
            )
        ):
            deliveries[d.job_id].append(d)
        requeues = conn.execute(
            text("SELECT job_id, attempt, next_attempt_at, error_class FROM public.faults_requeues")
        ).all()

    def named(job_id: uuid.UUID) -> str:
        if job_id in hostile_jobs:
            page, hook = plays[hostile_jobs[job_id]]
            return f"page {page} / hook {hook}"
        return f"good {good_jobs.get(job_id, job_id)}"

    outcome.operations = len(world.accepted)
    outcome.faults_injected = len(seen)

    # every_job_ends
    not_ended = [
        f"{named(i)}: {jobs[i].status}, attempts {jobs[i].attempts}, "
        f"{jobs[i].last_error_class}, next in {jobs[i].next_in}"
        for i in world.accepted
        if jobs[i].status not in TERMINAL
    ]
    unannounced = [
        f"{named(i)}: {[d.outcome for d in deliveries[i]]}"
        for i in world.accepted
        if jobs[i].status in TERMINAL and jobs[i].finish_published_at is None
    ]
    outcome.check(
        "every_job_ends",
        not not_ended and not unannounced,
        f"{len(not_ended)} jobs not terminal {not_ended[:4]}; {len(unannounced)} webhooks "
        f"never closed {unannounced[:4]}" + (f"; {stalled}" if stalled else ""),
    )

    # attempts_within_budget, by the job's records and by the peer's own count
    fetched = Counter(r.name for r in seen if r.method == "GET" and r.first_hop)
    posted = Counter(r.name for r in seen if r.method == "POST")
    over: list[str] = []
    for job_id, name in hostile_jobs.items():
        if max(len(attempts[job_id]), jobs[job_id].attempts, fetched[name]) > max_attempts:
            over.append(
                f"{named(job_id)}: {len(attempts[job_id])} attempts, {fetched[name]} at the peer"
            )
        if max(len(deliveries[job_id]), posted[name]) > webhook_max_attempts:
            over.append(
                f"{named(job_id)}: {len(deliveries[job_id])} webhook attempts, "
                f"{posted[name]} at the peer"
            )
    outcome.check(
        "attempts_within_budget",
        not over,
        f"{len(over)} over the budget ({max_attempts} attempts, {webhook_max_attempts} "
        f"webhook attempts): {over[:4]}",
    )

    # retried_with_backoff
    unbacked: list[str] = []
    for q in requeues:
        following = [a for a in attempts[q.job_id] if a.number == q.attempt + 1]
        if q.error_class in AT_ONCE:
            unbacked.append(f"{named(q.job_id)}: attempt {q.attempt} ({q.error_class}) at once")
        elif following and following[0].started_at < q.next_attempt_at:
            unbacked.append(
                f"{named(q.job_id)}: attempt {q.attempt + 1} started "
                f"{(q.next_attempt_at - following[0].started_at).total_seconds():.2f} s early"
            )
    outcome.check(
        "retried_with_backoff",
        not unbacked,
        f"{len(unbacked)} retries without backoff: {unbacked[:4]}",
    )

    # other_tenants_unaffected
    served = Counter(s.path for s in list(world.site.served) if s.status == 200)
    received = Counter(e["id"] for e in world.receiver.events())
    affected: list[str] = []
    for job_id, path in good_jobs.items():
        job = jobs[job_id]
        announced = [(d.outcome, d.error_class) for d in deliveries[job_id]]
        if job.status != "succeeded" or job.attempts != 1 or served[path] != 1:
            affected.append(
                f"{path}: {job.status} after {job.attempts} attempts, served {served[path]}x"
            )
        if received[str(job_id)] != 1 or announced != [("delivered", None)]:
            affected.append(f"{path}: webhook received {received[str(job_id)]}x, {announced}")
    strays = set(received) - {str(i) for i in good_jobs}
    outcome.check(
        "other_tenants_unaffected",
        not affected and not strays,
        f"{len(affected)} of the good tenant's jobs affected {affected[:4]}; "
        f"{len(strays)} webhooks at its receiver that are not its own",
    )

    outcome.lost = (
        len(not_ended) + len(unannounced) + sum(jobs[i].status != "succeeded" for i in good_jobs)
    )
    outcome.duplicated = sum(
        sum(a.outcome in TERMINAL for a in rows) > 1 for rows in attempts.values()
    ) + sum(max(n - 1, 0) for n in served.values())
    outcome.redeliveries = sum(max(n - 1, 0) for n in received.values())
    settled = sorted(
        ((jobs[i].finish_published_at - jobs[i].created_at).total_seconds(), named(i))
        for i in hostile_jobs
        if jobs[i].finish_published_at is not None
    )
    log.info("hostile peer: the slowest to settle: %s", settled[-5:])
    outcome.recovered_after(max(settled, default=(0.0, ""))[0])
