"""Scraping: every accepted job ends; each succeeded one has exactly one result object in
the bucket, holding the bytes the target served; no job is worked by two workers at once;
every finish is announced to the job's callback at least once.

A stream of jobs goes through `pin scraping work` processes (kept alive by the scenario, as
the sensor launches runs) while one kind of fault is injected. The results go to moto's S3
server, the pages come from the demo site and the webhooks go to a recording receiver, each
behind a FaultProxy on loopback. The sweeper and the webhook delivery loop run in this
process (what their schedules do), through the same functions the CLI calls.

The invariants are checked against independent records: the bucket listed and each
object's bytes hashed, the demo site's own log of what it served and when, the receiver's
log of what it got. Job status (the job's own bookkeeping) only says when to stop waiting.
Redeliveries are the at-least-once repeats: pages fetched again after a worker died and
webhooks delivered again after a lost answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from faults.clock import JumpingClock
from faults.core import FaultContext, Outcome, scenario, wait_until
from faults.proxy import FaultProxy

log = logging.getLogger(__name__)

LEASE_SECONDS = 1.5
FETCH_TIMEOUT_SECONDS = 1.5
WEBHOOK_TIMEOUT_SECONDS = 1.0
# A page takes this long at the target, so two workers fetching one job at once overlap
# there. Below 2/3 of the lease: a dead worker's last fetch has ended at the target before
# its lease (renewed every third of it) can run out and the job be fetched again.
PAGE_MS = 250
# The PostgreSQL hang scenario: how long each hang lasts, and the workers' lease there (a
# worker that cannot renew for longer than its lease loses its jobs, by design).
HANG_SECONDS = (5.0, 15.0, 30.0)
HANG_LEASE_SECONDS = 45.0
WORKERS = 2
SLOTS = 6
TERMINAL = ("succeeded", "failed", "cancelled")
AWS_REGION = "us-east-1"


class MotoS3:
    """moto's S3 server on a loopback port of this process. `restart()` stops it (every
    connection refused) and starts it again on the same port; the objects live in moto's
    in-process backend, so they survive it, as a real store's do."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        # One access-log line per request would bury the suite's own output.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self) -> Any:
        """A client straight to moto (never through a proxy): the suite's view of the bucket."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=AWS_REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def restart(self, *, down_seconds: float) -> None:
        from moto.server import ThreadedMotoServer

        self._server.stop()
        time.sleep(down_seconds)  # the outage itself
        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


@dataclasses.dataclass
class World:
    """One scenario's service and its stand-ins."""

    ctx: FaultContext
    engine: Engine
    env: dict[str, str]
    s3: MotoS3
    bucket: str
    s3_proxy: FaultProxy
    site: Any  # ScrapingTarget
    target: FaultProxy
    receiver: Any  # Receiver
    hooks: FaultProxy
    # Between the workers and PostgreSQL when the scenario hangs the database (else unused).
    database: FaultProxy
    accepted: list[uuid.UUID] = dataclasses.field(default_factory=list)
    workers: list[Any] = dataclasses.field(default_factory=list)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    feeding: threading.Event = dataclasses.field(default_factory=threading.Event)
    keep_workers: bool = True
    # Set: the workers run `run_worker` with this jumping clock instead of `pin scraping work`.
    clock: JumpingClock | None = None

    def kill_workers(self) -> int:
        """SIGKILL every live worker process; returns how many."""
        alive = [w for w in self.workers if w.poll() is None]
        for worker in alive:
            self.ctx.sigkill(worker)
        return len(alive)

    def count(self, status: str) -> int:
        try:
            with self.engine.connect() as conn:
                return conn.execute(
                    text("SELECT count(*) FROM scraping.jobs WHERE status = :s"), {"s": status}
                ).scalar_one()
        except Exception:  # the database is restarting: nothing known yet
            return -1

    def progress_after(self, fault_ended: float, *, what: str, timeout: float = 30) -> float:
        """Seconds from `fault_ended` until a job succeeds and a webhook arrives: the
        service is working again."""
        jobs, hooks = self.count("succeeded"), len(self.receiver.received)
        self.wait_for(
            lambda: (
                (self.count("succeeded") > jobs and len(self.receiver.received) > hooks)
                or self.done()
            ),
            timeout=timeout,
            what=what,
        )
        return time.monotonic() - fault_ended

    def wait_for(self, condition: Callable[[], bool], *, timeout: float, what: str) -> None:
        """wait_until, and on a timeout say what the service still owes (`owing`)."""
        try:
            wait_until(condition, timeout=timeout, what=what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} ({self.owing()})") from None

    def done(self) -> bool:
        """Every job fed has ended and announced its end (the job's own view: when to stop
        waiting; the invariants are checked elsewhere)."""
        try:
            with self.engine.connect() as conn:
                owing = conn.execute(
                    text(
                        "SELECT count(*) FROM scraping.jobs WHERE status NOT IN "
                        "('succeeded', 'failed', 'cancelled') OR finish_published_at IS NULL"
                    )
                ).scalar_one()
        except Exception:
            return False
        return owing == 0 and not self.feeding.is_set()

    def owing(self) -> str:
        """What `done` still waits for, for the failure message: the jobs not ended or not
        announced (state, lease, next attempts on the database's clock), whether the feeder
        still runs, and which of the service's loops are alive."""
        threads = sorted(t.name for t in threading.enumerate() if t.name in SERVICE_LOOPS)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT status, attempts, webhook_attempts, "
                        "round(extract(epoch FROM lease_expires_at - now())) AS lease_in, "
                        "round(extract(epoch FROM next_attempt_at - now())) AS next_in, "
                        "round(extract(epoch FROM webhook_next_attempt_at - now())) AS hook_in "
                        "FROM scraping.jobs WHERE status NOT IN "
                        "('succeeded', 'failed', 'cancelled') OR finish_published_at IS NULL "
                        "ORDER BY created_at LIMIT 5"
                    )
                ).all()
                # The scheduler's view: a queued job is claimable only through its
                # (domain, class) queue, and only while the domain has room.
                queues = conn.execute(
                    text(
                        "SELECT q.domain, q.priority, q.ready, q.waiting_for, "
                        "round(extract(epoch FROM q.wake_at - clock_timestamp())) AS wake_in, "
                        "round(extract(epoch FROM d.blocked_until - clock_timestamp())) "
                        "AS blocked_in, d.tokens "
                        "FROM scraping.domain_queues q "
                        "LEFT JOIN scraping.domains d ON d.domain = q.domain LIMIT 5"
                    )
                ).all()
            jobs = (
                "; ".join(
                    f"{r.status} attempts={r.attempts} webhook_attempts={r.webhook_attempts} "
                    f"lease_in={r.lease_in}s next_in={r.next_in}s webhook_in={r.hook_in}s"
                    for r in rows
                )
                or "no job"
            )
            jobs += " | queues: " + (
                "; ".join(
                    f"{q.domain}/{q.priority} ready={q.ready} waiting_for={q.waiting_for} "
                    f"wake_in={q.wake_in}s blocked_in={q.blocked_in}s tokens={q.tokens}"
                    for q in queues
                )
                or "none"
            )
        except Exception as exc:  # noqa: BLE001 — a message, not a check
            jobs = f"(not readable: {exc!r})"
        return f"owing: {jobs}; feeding={self.feeding.is_set()}; loops alive: {threads}"


def _worker_env(ctx: FaultContext, url: str, s3_proxy: FaultProxy, bucket: str) -> dict[str, str]:
    missing = str(ctx.workdir / "no-aws-config")
    return ctx.pin_env(
        url,
        PIN_S3_BUCKET=bucket,
        PIN_S3_ENDPOINT_URL=f"http://{s3_proxy.address}",
        PIN_S3_REGION=AWS_REGION,
        # boto3 finds these and looks no further (no profile, no metadata service).
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=missing,
        AWS_SHARED_CREDENTIALS_FILE=missing,
        AWS_EC2_METADATA_DISABLED="true",
        PIN_SCRAPING_ALLOWED_CIDRS="127.0.0.1/32",
        PIN_SCRAPING_LEASE_SECONDS=str(LEASE_SECONDS),
        PIN_SCRAPING_FETCH_TIMEOUT_SECONDS=str(FETCH_TIMEOUT_SECONDS),
        PIN_SCRAPING_SLOTS=str(SLOTS),
        # Outages last seconds here: retries come back within them and a job's budget
        # outlasts a few (an exhausted job is failed: terminal, not lost).
        PIN_SCRAPING_MAX_ATTEMPTS="12",
        PIN_SCRAPING_BACKOFF_BASE_SECONDS="0.2",
        PIN_SCRAPING_BACKOFF_CAP_SECONDS="1.0",
        # Every job goes to one host: politeness out of the way.
        PIN_SCRAPING_DOMAIN_RPS="10000",
        PIN_SCRAPING_DOMAIN_CONCURRENCY="1000",
        PIN_WEBHOOK_TIMEOUT_SECONDS=str(WEBHOOK_TIMEOUT_SECONDS),
        PIN_WEBHOOK_MAX_ATTEMPTS="100",
        PIN_WEBHOOK_BACKOFF_BASE_SECONDS="0.1",
        PIN_WEBHOOK_BACKOFF_CAP_SECONDS="0.5",
    )


@contextlib.contextmanager
def _world(ctx: FaultContext, *, database_via_proxy: bool = False) -> Iterator[World]:
    """The service's stand-ins. With `database_via_proxy` the workers reach PostgreSQL
    through `world.database` (the feeder, sweeper and deliveries do not: a hang is the
    workers' alone), with leases longer than the hangs and connects that time out."""
    from faults.postgres import database_url_via
    from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
    from pin_orchestration.devstack.standins.webhook_receiver import Receiver
    from pin_orchestration.platform.db import create_db_engine

    url = ctx.postgres.create_database("scraping")
    s3 = MotoS3()
    bucket = f"results-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    site = ScrapingTarget().start()
    receiver = Receiver()
    host, port = site.url.removeprefix("http://").split(":")
    with (
        FaultProxy(s3.host, s3.port) as s3_proxy,
        FaultProxy(host, int(port)) as target,
        FaultProxy("127.0.0.1", receiver.port) as hooks,
        FaultProxy(*ctx.postgres.tcp_address) as database,
    ):
        env = _worker_env(ctx, url, s3_proxy, bucket)
        if database_via_proxy:
            env["PIN_DATABASE_URL"] = f"{database_url_via(url, database)}?connect_timeout=5"
            env["PIN_SCRAPING_LEASE_SECONDS"] = str(HANG_LEASE_SECONDS)
        world = World(
            ctx=ctx,
            engine=create_db_engine(url),
            env=env,
            s3=s3,
            bucket=bucket,
            s3_proxy=s3_proxy,
            site=site,
            target=target,
            receiver=receiver,
            hooks=hooks,
            database=database,
        )
        try:
            yield world
        finally:
            world.stop.set()
            ctx.stop_children()
            world.engine.dispose()
            site.stop()
            receiver.close()
            s3.stop()


# The service's loops (threads of the scenario's process), named for `World.owing`.
SERVICE_LOOPS = ("feeder", "workers", "sweeper", "webhooks")


def _forever(world: World, every: float, step: Callable[[], None], name: str) -> None:
    """Run `step` every `every` seconds until the world stops, in a daemon thread; a failing
    step (the database restarting) is logged and tried again."""

    def loop() -> None:
        while not world.stop.wait(every):
            try:
                step()
            except Exception as exc:
                log.debug("%s: %r", name, exc)

    threading.Thread(target=loop, name=name, daemon=True).start()


def _start_service(world: World, jobs: int, feed_seconds: float) -> None:
    """The feeder, then the service's loops (`_start_loops`)."""
    from pin_orchestration.scraping.store.tenancy import create_tenant

    tenant, _ = create_tenant(world.engine, "faults")
    world.feeding.set()
    threading.Thread(
        target=_feed, args=(world, tenant.id, jobs, feed_seconds), daemon=True, name="feeder"
    ).start()
    _start_loops(world)


def _start_loops(world: World) -> None:
    """The worker processes (respawned when one exits or is killed, as the sensor launches
    runs), the lease sweeper and the webhook delivery loop."""
    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.policies import (
        webhook_fetch_policy_from,
        webhook_policy_from,
    )
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.store.leases import sweep_expired_leases
    from pin_orchestration.scraping.webhooks.deliveries import run_deliveries
    from pin_orchestration.scraping.webhooks.options import DeliveryOptions

    settings = ScrapingSettings.from_env(world.env)

    def keep_workers() -> None:
        if not world.keep_workers:
            return
        alive = [w for w in world.workers if w.poll() is None]
        for _ in range(WORKERS - len(alive)):
            name = f"worker-{len(world.workers)}"
            if world.clock is None:
                args = ["scraping", "work", "--idle-exit-seconds", "3"]
                world.workers.append(world.ctx.spawn_pin(args, world.env, name=name))
            else:
                args = ["-m", __name__, "worker", str(world.clock.path)]
                world.workers.append(world.ctx.spawn(args, world.env, name=name))

    keep_workers()
    _forever(world, 0.2, keep_workers, "workers")
    _forever(
        world,
        0.3,
        lambda: sweep_expired_leases(world.engine, max_attempts=settings.max_attempts),
        "sweeper",
    )
    fetcher = Fetcher(webhook_fetch_policy_from(settings))
    policy = webhook_policy_from(settings)
    _forever(
        world,
        0.2,
        lambda: run_deliveries(
            world.engine, fetcher, policy, DeliveryOptions(batch_size=20), stop=world.stop
        ),
        "webhooks",
    )


def _feed(world: World, tenant_id: uuid.UUID, jobs: int, feed_seconds: float) -> None:
    """Submit `jobs` jobs spread over `feed_seconds`. Each has an Idempotency-Key, so a submit
    whose answer was lost (the database restarting) is retried without a second job."""
    from pin_orchestration.scraping.store.repository import JobRequest, submit_job

    try:
        for i in range(jobs):
            request = JobRequest(
                url=f"http://{world.target.address}/slow/job-{i}",
                # A size of its own: each job's page has a different sha256.
                params={"ms": PAGE_MS, "bytes": 1000 + i},
                callback_url=f"http://{world.hooks.address}/hook/{i}",
            )
            while not world.stop.is_set():
                try:
                    world.accepted.append(submit_job(world.engine, tenant_id, request, f"k{i}").id)
                    break
                except Exception as exc:
                    log.debug("submit %d: %r", i, exc)
                    time.sleep(0.2)
            time.sleep(feed_seconds / jobs)
    finally:
        world.feeding.clear()


def _run(
    ctx: FaultContext,
    fault: str,
    inject: Callable[[World, Outcome], None],
    *,
    jobs: int,
    clock: bool = False,
    database_via_proxy: bool = False,
) -> Outcome:
    outcome = Outcome(job="scraping", fault=fault)
    with _world(ctx, database_via_proxy=database_via_proxy) as world:
        if clock:
            world.clock = JumpingClock(ctx.workdir / "clock-offset")
        _start_service(world, jobs, feed_seconds=max(4.0, jobs / 10))
        # Faults land mid-stream: once work is flowing.
        wait_until(lambda: world.count("succeeded") > 0, timeout=60, what="a first job done")
        inject(world, outcome)
        world.wait_for(world.done, timeout=120, what="every job ended and announced")
        world.stop.set()
        ctx.stop_children()
        check(world, outcome)
    return outcome


# --- the invariants ------------------------------------------------------------------------


def _object_hashes(world: World) -> dict[str, str]:
    client = world.s3.client()
    hashes: dict[str, str] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=world.bucket):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=world.bucket, Key=item["Key"])["Body"].read()
            hashes[item["Key"]] = hashlib.sha256(body).hexdigest()
    return hashes


def _overlapping_fetches(served: list[Any]) -> list[str]:
    by_path: dict[str, list[Any]] = defaultdict(list)
    for s in served:
        by_path[s.path].append(s)
    overlaps = []
    for path, answers in by_path.items():
        answers.sort(key=lambda s: s.arrived)
        for first, second in zip(answers, answers[1:], strict=False):
            if second.arrived < first.answered:
                overlaps.append(path)
    return overlaps


def _sweep_attempt_objects(world: World) -> int:
    """pin-retention's sweep of the objects jobs ended without, run now for every ended job
    (not after its two days): what is left in the bucket must then be exactly the results."""
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta

    from pin_orchestration.areas import retention_rules
    from pin_orchestration.coordination.retention import KINDS, delete_batch
    from pin_orchestration.scraping.store.results import S3ResultStore

    [kind] = [k for k in KINDS if k.name == "scraping_attempt_objects"]
    store = S3ResultStore(world.s3.client(), world.bucket)
    cutoff = datetime.now(UTC) + timedelta(days=1)
    deleted = 0
    rules = replace(retention_rules(), result_store=lambda: store)
    while batch := delete_batch(world.engine, kind, cutoff, 1000, rules):
        deleted += batch
    return deleted


def check(world: World, outcome: Outcome) -> None:
    swept = _sweep_attempt_objects(world)
    log.info("scraping check: retention deleted %d keys jobs ended without", swept)
    with world.engine.connect() as conn:
        jobs = {
            r.id: r
            for r in conn.execute(
                text("SELECT id, status, url, callback_url, result_key FROM scraping.jobs")
            )
        }
        attempts = conn.execute(text("SELECT job_id, outcome FROM scraping.job_attempts")).all()
    objects = _object_hashes(world)
    objects_of: dict[str, list[str]] = defaultdict(list)
    for key in objects:  # results/{tenant}/{yyyy}/{mm}/{dd}/{job}/{attempt}
        objects_of[key.split("/")[5]].append(key)
    served: dict[str, set[str]] = defaultdict(set)
    fetches: Counter[str] = Counter()
    for s in list(world.site.served):
        fetches[s.path] += 1
        if s.status == 200:
            served[s.path].add(s.sha256)
    announced: dict[str, list[str]] = defaultdict(list)
    for event in world.receiver.events():
        announced[event["id"]].append(event["status"])
    terminal_attempts = Counter(a.job_id for a in attempts if a.outcome in TERMINAL)

    outcome.operations = len(world.accepted)
    not_ended = [i for i in world.accepted if i not in jobs or jobs[i].status not in TERMINAL]
    unstored, extra, mismatched, two_ends, unannounced = [], [], [], [], []
    for job_id in world.accepted:
        job = jobs.get(job_id)
        if job is None:
            continue
        keys = objects_of.get(str(job_id), [])
        path = job.url.split("//", 1)[1].split("/", 1)[1].split("?", 1)[0]
        if len(keys) > 1 or (keys and job.status != "succeeded"):
            extra.append(f"{job_id} ({job.status}): {keys}")
        if job.status == "succeeded":
            if not keys:
                unstored.append(str(job_id))
            elif keys != [job.result_key] or objects[keys[0]] not in served[f"/{path}"]:
                mismatched.append(f"{job_id} ({keys[0]})")
        statuses = set(announced.get(str(job_id), []))
        if terminal_attempts[job_id] > 1 or (statuses and statuses != {job.status}):
            two_ends.append(f"{job_id}: {terminal_attempts[job_id]} ends, announced {statuses}")
        if job.status in TERMINAL and job.callback_url and not statuses:
            unannounced.append(str(job_id))
    overlaps = _overlapping_fetches(list(world.site.served))

    outcome.lost = len(not_ended) + len(unstored)
    outcome.duplicated = len(extra) + len(overlaps) + len(two_ends)
    outcome.redeliveries = sum(len(v) - 1 for v in announced.values()) + sum(
        n - 1 for n in fetches.values()
    )
    outcome.check(
        "every_job_ends",
        not not_ended,
        f"{len(not_ended)} accepted jobs not terminal: {not_ended[:3]}",
    )
    outcome.check(
        "one_result_per_job",
        not unstored and not extra,
        f"{len(unstored)} succeeded without an object in the bucket {unstored[:3]}; "
        f"{len(extra)} with more than one, or one without succeeding {extra[:3]}",
    )
    outcome.check(
        "result_matches_source",
        not mismatched,
        f"{len(mismatched)} objects not what the target served: {mismatched[:3]}",
    )
    outcome.check(
        "single_fetcher",
        not overlaps,
        f"{len(overlaps)} pages fetched by two workers at once: {overlaps[:3]}",
    )
    outcome.check("one_end_per_job", not two_ends, f"{len(two_ends)}: {two_ends[:3]}")
    outcome.check(
        "webhook_delivered",
        not unannounced,
        f"{len(unannounced)} ended jobs never announced to the receiver: {unannounced[:3]}",
    )
    log.info("scraping check: %s", json.dumps(dataclasses.asdict(outcome), default=str))


# --- the faults ----------------------------------------------------------------------------


def _kill_workers(world: World, outcome: Outcome, kills: int) -> None:
    """Kill every worker at once, `kills` times. Each kill comes just after a job was marked
    succeeded while the store answers slowly: other jobs are mid-put then, so a worker that
    marked a job before storing it is caught in that window."""
    for _ in range(kills):
        time.sleep(world.ctx.rng.uniform(0.2, 1.0))
        world.s3_proxy.set_mode("slow", delay_seconds=0.4)
        before = world.count("succeeded")
        with contextlib.suppress(TimeoutError):
            wait_until(
                lambda b=before: world.count("succeeded") > b,
                timeout=10,
                every=0.02,
                what="a job succeeded while the store is slow",
            )
        outcome.faults_injected += world.kill_workers()
        world.s3_proxy.set_mode("pass")
        outcome.recovered_after(
            world.progress_after(time.monotonic(), what="a job done after the workers died")
        )


def _restart_postgres(world: World, outcome: Outcome, restarts: int) -> None:
    for _ in range(restarts):
        time.sleep(world.ctx.rng.uniform(0.3, 1.0))
        world.ctx.postgres.restart(down_seconds=world.ctx.rng.uniform(0.2, 1.0))
        outcome.faults_injected += 1
        outcome.recovered_after(
            world.progress_after(time.monotonic(), what="a job done after PostgreSQL restarted")
        )


def _hang_postgres(world: World, outcome: Outcome, hangs: int) -> None:
    """Blackhole the workers' PostgreSQL (connections open, nothing answered, new ones
    accepted and never served) mid-stream, for 5 s, then longer, up to 30 s. Odd hangs end
    by lifting (held queries go through late), even ones by resetting every connection
    (what a client's TCP timeout would end with): the workers' calls fail and are retried."""
    for n in range(hangs):
        time.sleep(world.ctx.rng.uniform(0.3, 1.0))
        world.database.set_mode("hang")
        time.sleep(HANG_SECONDS[min(n, len(HANG_SECONDS) - 1)])
        if n % 2:
            world.database.reset_all()
        world.database.set_mode("pass")
        outcome.faults_injected += 1
        outcome.recovered_after(
            world.progress_after(time.monotonic(), what="a job done after PostgreSQL hung")
        )


def _proxy_faults(
    world: World, outcome: Outcome, proxy: FaultProxy, rounds: int, *, slow_delay: float
) -> None:
    """Cut the connection (refused), reset it, hang it, slow it: one after the other, each
    for a second or two mid-stream, `rounds` times. A hang ends with every held connection
    reset, so nothing the client gave up on reaches the server later."""
    for _ in range(rounds):
        for mode in ("down", "reset", "hang", "slow"):
            time.sleep(world.ctx.rng.uniform(0.2, 0.6))
            proxy.set_mode(mode, delay_seconds=slow_delay)  # type: ignore[arg-type]
            time.sleep(world.ctx.rng.uniform(1.0, 2.0))
            if mode == "hang":
                proxy.reset_all()
            proxy.set_mode("pass")
            outcome.faults_injected += 1
            outcome.recovered_after(
                world.progress_after(time.monotonic(), what=f"a job done after {mode}")
            )


def _store_faults(world: World, outcome: Outcome, rounds: int) -> None:
    for _ in range(rounds):
        _proxy_faults(world, outcome, world.s3_proxy, 1, slow_delay=0.5)
        time.sleep(world.ctx.rng.uniform(0.2, 0.6))
        world.s3.restart(down_seconds=world.ctx.rng.uniform(0.5, 1.5))
        # A crashed server's connections are reset by its kernel; moto stopped in-process
        # leaves them open and unanswered, and boto3 would wait out its 60 s read timeout.
        world.s3_proxy.reset_all()
        outcome.faults_injected += 1
        outcome.recovered_after(
            world.progress_after(time.monotonic(), what="a job done after moto restarted")
        )


Inject = Callable[[World, Outcome, int], None]


def _jump_clock(world: World, outcome: Outcome, rounds: int) -> None:
    """The workers' clock jumps an hour ahead, then an hour back, each while the target
    is down, so retries (backoff) are decided with the jumped clock. Retry times
    reach the database as delays from its now(): a worker an hour ahead must not park its
    retries for an hour (every_job_ends would time out), nor one behind run them early."""
    assert world.clock is not None
    for _ in range(rounds):
        for offset in (3600.0, -3600.0):
            time.sleep(world.ctx.rng.uniform(0.2, 0.6))
            world.clock.set(offset)
            # Down resets the pooled keep-alive connections too: every fetch fails now.
            world.target.set_mode("down")
            time.sleep(world.ctx.rng.uniform(1.0, 2.0))
            world.target.set_mode("pass")
            outcome.faults_injected += 1
            outcome.recovered_after(
                # Retries are due within the backoff cap (1 s) once the target is back; 15 s
                # is ample, and a parked queue is told apart sooner than by the usual 30 s.
                world.progress_after(
                    time.monotonic(),
                    what=f"a job done with the clock {offset:+.0f} s off",
                    timeout=15,
                )
            )
            world.clock.set(0.0)


def run_worker_on_a_jumping_clock(clock_file: str) -> None:
    """What `pin scraping work` runs, with the wall clock read through the clock file."""
    from pin_orchestration.platform.db import engine_from_env
    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.policies import fetch_policy_from, retry_policy_from
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.store.local import result_store_from
    from pin_orchestration.scraping.worker.options import WorkerOptions
    from pin_orchestration.scraping.worker.run import run_worker

    settings = ScrapingSettings.from_env()
    options = WorkerOptions(
        slots=settings.slots,
        lease_seconds=settings.lease_seconds,
        idle_exit_seconds=3,
        domain_rps=settings.domain_rps,
        domain_concurrency=settings.domain_concurrency,
    )
    run_worker(
        engine_from_env(),
        result_store_from(settings),
        Fetcher(fetch_policy_from(settings)),
        retry_policy_from(settings),
        options,
        clock=JumpingClock(Path(clock_file)).now,
    )


def _register(
    name: str,
    fault: str,
    inject: Inject,
    *,
    faults: tuple[int, int],
    jobs: int,
    clock: bool = False,
    database_via_proxy: bool = False,
) -> None:
    """A scenario: `inject` gets the number of faults (quick, full) mid-stream of `jobs`
    jobs in full mode (30 in quick)."""

    @scenario(name, job="scraping", fault=fault)
    def run(ctx: FaultContext) -> Outcome:
        n = ctx.scale(*faults)
        return _run(
            ctx,
            fault,
            lambda w, o: inject(w, o, n),
            jobs=ctx.scale(30, jobs),
            clock=clock,
            database_via_proxy=database_via_proxy,
        )


# (name, fault, inject, faults in quick and full mode, jobs in full mode). The webhook's
# slow mode is slower than its timeout both ways: the receiver gets the call, the answer
# comes too late, the delivery is retried (a redelivery, which at-least-once allows).
SCENARIOS: list[tuple[str, str, Inject, tuple[int, int], int]] = [
    ("scraping-sigkill", "SIGKILL of the workers", _kill_workers, (2, 10), 300),
    ("scraping-pg-restart", "PostgreSQL restarted", _restart_postgres, (1, 4), 200),
    ("scraping-s3", "S3 down/reset/hung/slow, moto restarted", _store_faults, (1, 3), 200),
    (
        "scraping-target",
        "target down/reset/hung/slow",
        lambda w, o, n: _proxy_faults(w, o, w.target, n, slow_delay=0.3),
        (1, 3),
        200,
    ),
    (
        "scraping-webhook",
        "webhook receiver down/reset/hung/slow",
        lambda w, o, n: _proxy_faults(w, o, w.hooks, n, slow_delay=0.6),
        (1, 3),
        200,
    ),
]
for _name, _fault, _inject, _faults, _jobs in SCENARIOS:
    _register(_name, _fault, _inject, faults=_faults, jobs=_jobs)
_register(
    "scraping-clock-jump",
    "workers' clock an hour ahead, then behind",
    _jump_clock,
    faults=(1, 3),
    jobs=200,
    clock=True,
)

_register(
    "scraping-pg-hang",
    "PostgreSQL hung (blackholed), 5 s to 30 s",
    _hang_postgres,
    faults=(1, 3),
    jobs=200,
    database_via_proxy=True,
)

if __name__ == "__main__" and sys.argv[1] == "worker":
    run_worker_on_a_jumping_clock(sys.argv[2])
