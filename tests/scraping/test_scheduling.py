"""The pick (issue 9): 6:3:1 priorities, weighted tenant fairness, per-domain limits shared
by every worker — against real PostgreSQL, workers on separate connections, and targets on
loopback that record what actually reached them."""

from __future__ import annotations

import dataclasses
import ipaddress
import random
import threading
import uuid
from collections import Counter
from typing import Any
from urllib.parse import urlencode

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from pin_orchestration.cli import main
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.platform.db import create_db_engine
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.policies import fetch_policy_from, retry_policy_from
from pin_orchestration.scraping.store import leases, politeness, repository
from pin_orchestration.scraping.store.leases import ClaimedJob, DomainDefaults
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.politeness import set_domain_limits
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.store.tenancy import set_tenant_weight
from pin_orchestration.scraping.worker.options import WorkerOptions
from pin_orchestration.scraping.worker.outcomes import WorkerReport
from pin_orchestration.scraping.worker.run import claim_due_jobs, run_worker
from tests.chessboard.test_concurrency import wait_until_blocked
from tests.scraping.conftest import TEST_SETTINGS, UNLIMITED, auth


def enqueue(
    engine: Engine, tenant_id: uuid.UUID, url: str, priority: str = "normal", **params: Any
) -> uuid.UUID:
    request = JobRequest(url=url, params=params, priority=priority)
    return repository.submit_job(engine, tenant_id, request, None).id


def enqueue_many(
    engine: Engine, tenant_id: uuid.UUID, urls: list[str], priority: str = "normal"
) -> None:
    """Many jobs in one statement (the tests need hundreds; intake itself is tested
    elsewhere), oldest first in list order."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, priority, next_attempt_at) "
                "SELECT gen_random_uuid(), :tenant_id, u.url, "
                "       split_part(split_part(u.url, '://', 2), '/', 1), :priority, "
                "       now() - interval '1 hour' + u.n * interval '1 ms' "
                "FROM unnest(CAST(:urls AS text[])) WITH ORDINALITY AS u(url, n)"
            ),
            {"tenant_id": tenant_id, "priority": priority, "urls": urls},
        )


def claim(engine: Engine, limit: int, defaults: DomainDefaults = UNLIMITED) -> list[ClaimedJob]:
    return claim_due_jobs(
        engine, worker="w", limit=limit, lease_seconds=60, domain_defaults=defaults
    )


def spread(prefix: str, n: int) -> list[str]:
    """n URLs over many hosts, so no domain limit binds."""
    return [f"http://{prefix}-{i % 50}.example/{i}" for i in range(n)]


# --- priorities ----------------------------------------------------------------------


def test_priorities_are_picked_6_3_1_over_each_window_of_ten(
    db_engine: Engine, make_tenant
) -> None:
    tenant, _ = make_tenant("shop")
    for priority in ("low", "normal", "high"):  # low queued first: age must not matter
        enqueue_many(db_engine, tenant.id, spread(priority, 100), priority)

    one_by_one = [claim(db_engine, 1)[0].priority for _ in range(50)]
    in_batches = [j.priority for _ in range(5) for j in claim(db_engine, 10)]

    for picks in (one_by_one, in_batches):
        windows = [Counter(picks[i : i + 10]) for i in range(0, 50, 10)]
        assert windows == [Counter(high=6, normal=3, low=1)] * 5


def test_an_empty_class_gives_its_share_and_low_moves_under_a_constant_high_stream(
    db_engine: Engine, make_tenant
) -> None:
    tenant, _ = make_tenant("shop")
    enqueue_many(db_engine, tenant.id, spread("low", 40), "low")
    lows_seen = 0
    for round_number in range(15):
        # The high stream outruns the claims: more high work arrives every round.
        enqueue_many(db_engine, tenant.id, spread(f"high{round_number}", 12), "high")
        batch = Counter(j.priority for j in claim(db_engine, 10))
        # normal is empty: its share goes to the others, the batch is full ...
        assert sum(batch.values()) == 10 and batch["normal"] == 0
        # ... and high's 6 and low's 1 keep their ratio: low gets one or two of ten.
        assert 1 <= batch["low"] <= 2, batch
        lows_seen += batch["low"]
    assert lows_seen in (21, 22)  # 150 picks at 1 in 7


# --- tenants ---------------------------------------------------------------------------


def test_tenants_share_a_class_by_weight(db_engine: Engine, make_tenant) -> None:
    tenants = {name: make_tenant(name)[0] for name in ("crawler", "shop", "analyst")}
    set_tenant_weight(db_engine, "shop", 2)
    # The crawler's burst is the oldest: FIFO would give it everything.
    for name in ("crawler", "shop", "analyst"):
        enqueue_many(db_engine, tenants[name].id, spread(name, 200))
    picked = Counter(j.tenant_id for _ in range(4) for j in claim(db_engine, 10))
    shares = {name: picked[t.id] for name, t in tenants.items()}
    assert shares == {"crawler": 10, "shop": 20, "analyst": 10}


def test_an_idle_tenant_returning_is_served_in_the_next_round_without_hoarding(
    db_engine: Engine, make_tenant
) -> None:
    crawler, analyst, shop = (make_tenant(n)[0] for n in ("crawler", "analyst", "shop"))
    enqueue_many(db_engine, shop.id, spread("shop-early", 3))
    enqueue_many(db_engine, crawler.id, spread("crawler", 400))
    enqueue_many(db_engine, analyst.id, spread("analyst", 400))
    claimed = [j.tenant_id for _ in range(10) for j in claim(db_engine, 20)]
    assert claimed.count(shop.id) == 3  # shop had little, then went idle

    enqueue_many(db_engine, shop.id, spread("shop-back", 40))
    # One pick round over the three tenants: shop is in it.
    assert shop.id in {j.tenant_id for j in claim(db_engine, 3)}
    # Idle time is not credit: shop now gets its third, not its 40 jobs at once.
    back = Counter(j.tenant_id for j in claim(db_engine, 30))
    assert back[shop.id] in (9, 10, 11), back


# --- domains ---------------------------------------------------------------------------


@pytest.mark.parametrize("busy_jobs", [10, 300], ids=["short-head", "head-past-256"])
def test_a_busy_domain_delays_only_its_own_jobs(
    db_engine: Engine, make_tenant, busy_jobs: int
) -> None:
    tenant, _ = make_tenant("crawler")
    set_domain_limits(db_engine, "busy.example", rps=None, concurrency=2)
    enqueue_many(db_engine, tenant.id, [f"http://busy.example/{i}" for i in range(busy_jobs)])
    enqueue_many(db_engine, tenant.id, [f"http://other-{i}.example/x" for i in range(5)])
    first = Counter(j.domain for j in claim(db_engine, 20))
    assert first["busy.example"] == 2
    assert sum(first.values()) == 7  # the five others, not an idle pool
    assert claim(db_engine, 20) == []  # busy.example is at its 2 connections


def test_the_rate_limit_spends_a_token_per_request(db_engine: Engine, make_tenant) -> None:
    tenant, _ = make_tenant("crawler")
    enqueue_many(db_engine, tenant.id, [f"http://slow.example/{i}" for i in range(10)])
    defaults = DomainDefaults(rps=3, concurrency=100)
    # A full bucket holds one second's worth: 3, then nothing until a token comes back.
    assert len(claim(db_engine, 10, defaults)) == 3
    assert claim(db_engine, 10, defaults) == []


def _worker_thread(
    url: str,
    store: LocalResultStore,
    options: WorkerOptions,
    name: str,
    reports: dict[str, WorkerReport],
) -> threading.Thread:
    """A worker run on an engine (connection pool) of its own."""

    def run() -> None:
        engine = create_db_engine(url)
        settings = dataclasses.replace(
            TEST_SETTINGS,
            fetch_timeout_seconds=10,
            allowed_cidrs=(ipaddress.ip_network("127.0.0.0/8"),),
        )
        fetcher = Fetcher(fetch_policy_from(settings))
        try:
            reports[name] = run_worker(
                engine,
                store,
                fetcher,
                retry_policy_from(settings),
                options,
                worker_id=name,
                rng=random.Random(1),
            )
        finally:
            fetcher.close()
            engine.dispose()

    return threading.Thread(target=run, name=name)


def _two_workers(
    url: str, store: LocalResultStore, options: WorkerOptions
) -> dict[str, WorkerReport]:
    """Two worker runs at once, each on its own engine; their reports by name."""
    reports: dict[str, WorkerReport] = {}
    workers = [_worker_thread(url, store, options, f"w{i}", reports) for i in (1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)  # a bound for a broken run only
    return reports


def _most_in_any_window(arrivals: list[float], rps: float, burst: float, slack: float) -> bool:
    """True when every stretch of arrivals fits the token bucket: n requests between the
    i-th and the j-th arrival need n <= burst + rps * (gap + slack). The slack covers the
    time from a claim (when the token is spent) to the request reaching the target, which
    varies by milliseconds from one worker thread to another."""
    for i in range(len(arrivals)):
        for j in range(i, len(arrivals)):
            if j - i + 1 > burst + rps * (arrivals[j] - arrivals[i] + slack):
                return False
    return True


def _claim_times(engine: Engine, domain: str) -> list[float]:
    """When each attempt of `domain`'s jobs was claimed, by PostgreSQL's clock (seconds)."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT extract(epoch FROM a.started_at)::float FROM scraping.job_attempts a"
                    " JOIN scraping.jobs j ON j.id = a.job_id WHERE j.domain = :d"
                    " ORDER BY a.started_at"
                ),
                {"d": domain},
            ).scalars()
        )


def test_two_workers_on_separate_connections_never_exceed_a_domains_limits(
    db_url: str, db_engine: Engine, make_tenant, local_store: LocalResultStore
) -> None:
    tenant, _ = make_tenant("crawler")
    rated = ScrapingTarget("127.0.0.3").start()  # 4 rps, 2 at once
    narrow = ScrapingTarget("127.0.0.5").start()  # 3 at once, rate out of the way
    try:
        set_domain_limits(db_engine, "127.0.0.3", rps=4, concurrency=2)
        set_domain_limits(db_engine, "127.0.0.5", rps=1000, concurrency=3)
        for i in range(16):
            enqueue(db_engine, tenant.id, f"{rated.url}/slow/{i}", ms=100)
        for i in range(12):
            enqueue(db_engine, tenant.id, f"{narrow.url}/slow/{i}", ms=500)
        # Three slots each: the two domains have room for five at once, so one worker can
        # never hold it all and the other always finds some (with eight slots the first
        # worker took every place and the second, finding none for a second, went idle).
        options = WorkerOptions(
            slots=3,
            lease_seconds=120,
            idle_exit_seconds=1.0,
            max_run_duration_seconds=60,
            poll_seconds=0.05,
            domain_rps=2,
            domain_concurrency=4,
        )
        reports = _two_workers(db_url, local_store, options)
    finally:
        rated.stop()
        narrow.stop()
    assert all(r.claimed > 0 for r in reports.values()) and len(reports) == 2
    assert sum(r.succeeded for r in reports.values()) == 28
    assert len(rated.served) == 16 and len(narrow.served) == 12
    # Never more at once than the limits, as the targets saw it ...
    assert rated.most_in_flight <= 2
    assert narrow.most_in_flight == 3
    # ... and never faster than the rate where the rate is spent: the claims, stamped by
    # PostgreSQL. (The arrivals at the target were checked once: a starved worker sends
    # a claimed fetch late, and two sent late together bunch, whatever the limiter did.)
    starts = _claim_times(db_engine, "127.0.0.3")
    assert len(starts) == 16
    assert _most_in_any_window(starts, rps=4, burst=4, slack=0.25)
    # The rate is what held rated back: 16 claims at 4/s after a burst of 4.
    assert starts[-1] - starts[0] >= (16 - 4) / 4 - 0.25


def test_a_429_pauses_its_domain_for_every_worker(
    db_url: str, db_engine: Engine, make_tenant, local_store: LocalResultStore
) -> None:
    """A 429's pause holds its domain for every worker, and no other domain; its end lets
    the domain's jobs go. The pause is 10 minutes, so a starved second worker still works
    inside it; its end is an operator's, shortened to a second (resume, pause 1 s), which
    the jobs then wait out."""
    tenant, _ = make_tenant("crawler")
    target = ScrapingTarget("127.0.0.3").start()
    elsewhere = ScrapingTarget("127.0.0.4").start()
    try:
        enqueue(db_engine, tenant.id, f"{target.url}/status/429", retry_after=600)
        options = WorkerOptions(
            slots=4,
            lease_seconds=120,
            idle_exit_seconds=0.3,
            max_run_duration_seconds=30,
            poll_seconds=0.05,
            domain_rps=100,
            domain_concurrency=10,
        )
        reports: dict[str, WorkerReport] = {}
        first = _worker_thread(db_url, local_store, options, "first", reports)
        first.start()
        first.join(timeout=120)
        answered_429 = target.served[0].answered
        with db_engine.connect() as conn:
            paused_until = conn.execute(
                text("SELECT blocked_until FROM scraping.domains WHERE domain = '127.0.0.3'")
            ).scalar_one()
        assert paused_until.timestamp() >= answered_429 + 590

        # Other jobs for the paused domain, and one elsewhere, taken by another worker:
        # the one elsewhere is not held up, the paused domain's wait.
        for i in range(3):
            enqueue(db_engine, tenant.id, f"{target.url}/slow/{i}", ms=0)
        enqueue(db_engine, tenant.id, f"{elsewhere.url}/slow/e", ms=0)
        options = dataclasses.replace(options, idle_exit_seconds=1.0)
        second = _worker_thread(db_url, local_store, options, "second", reports)
        second.start()
        second.join(timeout=120)
        assert reports["second"].succeeded == 1
        assert len(elsewhere.served) == 1
        assert not [s for s in target.served if s.path.startswith("/slow")]

        # The pause's end: the domain's jobs wait for it, then go.
        assert politeness.resume_domain(db_engine, "127.0.0.3")
        ends = politeness.pause_domain(db_engine, "127.0.0.3", seconds=1, max_pause_seconds=60)
        options = dataclasses.replace(options, idle_exit_seconds=4.0)
        third = _worker_thread(db_url, local_store, options, "third", reports)
        third.start()
        third.join(timeout=120)
    finally:
        target.stop()
        elsewhere.stop()
    assert reports["third"].succeeded == 3
    later = [s for s in target.served if s.path.startswith("/slow")]
    assert len(later) == 3
    assert min(s.arrived for s in later) >= ends.timestamp()


def _redirect(origin: ScrapingTarget, to: str) -> str:
    return f"{origin.url}/redirect?{urlencode({'to': to})}"


def test_a_redirect_hop_counts_against_the_hop_hosts_limits_across_workers(
    db_url: str, db_engine: Engine, make_tenant, local_store: LocalResultStore
) -> None:
    tenant, _ = make_tenant("crawler")
    origin = ScrapingTarget("127.0.0.6").start()  # limits out of the way
    hop = ScrapingTarget("127.0.0.7").start()  # 4 rps, 2 at once: for its own jobs and for hops
    try:
        set_domain_limits(db_engine, "127.0.0.6", rps=1000, concurrency=100)
        set_domain_limits(db_engine, "127.0.0.7", rps=4, concurrency=2)
        for i in range(10):
            enqueue(db_engine, tenant.id, _redirect(origin, f"{hop.url}/slow/r{i}?ms=300"))
        for i in range(4):
            enqueue(db_engine, tenant.id, f"{hop.url}/slow/d{i}", ms=300)
        options = WorkerOptions(
            slots=4,
            lease_seconds=120,
            idle_exit_seconds=1.0,
            max_run_duration_seconds=60,
            poll_seconds=0.05,
            domain_rps=2,
            domain_concurrency=4,
        )
        reports = _two_workers(db_url, local_store, options)
    finally:
        origin.stop()
        hop.stop()
    assert all(r.claimed > 0 for r in reports.values()) and len(reports) == 2
    assert sum(r.succeeded for r in reports.values()) == 14
    with db_engine.connect() as conn:
        retried = conn.execute(
            text(
                "SELECT j.url, a.number, a.outcome, a.error_class, a.error_detail"
                " FROM scraping.job_attempts a JOIN scraping.jobs j ON j.id = a.job_id"
                " WHERE a.outcome IS DISTINCT FROM 'succeeded'"
            )
        ).all()
    # Every hop waits for its slot, none fails: a page is fetched once.
    assert not retried, retried
    assert len(origin.served) == 10 and len(hop.served) == 14
    # The hop host, as it saw it: never more than 2 at once, its rate held for hops and
    # its own jobs together (without the hop slots, 8 slots' hops arrive at once).
    assert hop.most_in_flight <= 2
    arrivals = hop.arrivals()
    # The span allows the same 0.25 s as the windows: a token is taken at the claim, the
    # arrival is stamped by the target, and the first request's connection set-up lags.
    assert _most_in_any_window(arrivals, rps=4, burst=4, slack=0.25)
    assert arrivals[-1] - arrivals[0] >= (14 - 4) / 4 - 0.25
    with db_engine.connect() as conn:  # every hop gave its slot back
        assert conn.execute(text("SELECT count(*) FROM scraping.redirect_slots")).scalar() == 0


def test_a_429_from_a_redirect_hop_pauses_the_hop_host_not_the_jobs_domain(
    db_url: str, db_engine: Engine, make_tenant, local_store: LocalResultStore
) -> None:
    tenant, _ = make_tenant("crawler")
    origin = ScrapingTarget("127.0.0.6").start()
    hop = ScrapingTarget("127.0.0.7").start()
    try:
        enqueue(db_engine, tenant.id, _redirect(origin, f"{hop.url}/status/429?retry_after=30"))
        options = WorkerOptions(
            slots=2,
            lease_seconds=120,
            idle_exit_seconds=0.3,
            max_run_duration_seconds=30,
            poll_seconds=0.05,
            domain_rps=100,
            domain_concurrency=10,
        )
        reports: dict[str, WorkerReport] = {}
        worker = _worker_thread(db_url, local_store, options, "w", reports)
        worker.start()
        worker.join(timeout=120)
    finally:
        origin.stop()
        hop.stop()
    assert reports["w"].retried == 1
    answered_429 = hop.served[0].answered
    with db_engine.connect() as conn:
        paused = dict(
            conn.execute(
                text(
                    "SELECT domain, blocked_until FROM scraping.domains "
                    "WHERE domain IN ('127.0.0.6', '127.0.0.7')"
                )
            ).all()
        )
    assert paused["127.0.0.7"].timestamp() >= answered_429 + 25
    assert paused.get("127.0.0.6") is None


# --- the sensor's view --------------------------------------------------------------------


def test_queue_stats_count_only_what_a_worker_could_claim(db_engine: Engine, make_tenant) -> None:
    tenant, _ = make_tenant("crawler")
    defaults = DomainDefaults(rps=100, concurrency=2)
    enqueue_many(db_engine, tenant.id, [f"http://full.example/{i}" for i in range(30)])
    assert len(claim(db_engine, 10, defaults)) == 2  # full.example: 2 running, 28 due
    enqueue_many(db_engine, tenant.id, [f"http://paused.example/{i}" for i in range(5)])
    with db_engine.begin() as conn:
        conn.execute(
            text("SELECT scraping.pause_domain('paused.example', now() + interval '1 minute')")
        )
        stats = leases.queue_stats(conn, defaults)
    assert (stats.due, stats.claimable) == (33, 0)

    enqueue_many(db_engine, tenant.id, [f"http://free.example/{i}" for i in range(5)])
    with db_engine.connect() as conn:
        stats = leases.queue_stats(conn, defaults)
    # free.example could take 2 now (its concurrency), not 5
    assert (stats.due, stats.claimable) == (38, 2)
    assert stats.oldest_claimable_age_seconds > 3000  # enqueue_many dates them an hour back


# --- intake and the command line -------------------------------------------------------------


def test_intake_records_the_domain_lowercased_and_idna(
    client, db_engine: Engine, make_tenant
) -> None:
    _, key = make_tenant("shop")
    created = client.post(
        "/jobs", json={"url": "https://BÜCHER.Example:8443/a?b=c"}, headers=auth(key)
    )
    assert created.status_code == 202
    with db_engine.connect() as conn:
        domain = conn.execute(
            text("SELECT domain FROM scraping.jobs WHERE id = :id"), {"id": created.json()["id"]}
        ).scalar_one()
    assert domain == "xn--bcher-kva.example"

    refused = client.post("/jobs", json={"url": "http://a..b\u0301x/"}, headers=auth(key))
    assert refused.status_code == 422
    assert "url" in refused.text and "host" in refused.text


def _pin(db_url: str, *args: str) -> Any:
    return CliRunner().invoke(main, list(args), env={"PIN_DATABASE_URL": db_url})


def test_domain_and_weight_commands(db_url: str, db_engine: Engine, make_tenant) -> None:
    tenant, _ = make_tenant("shop")
    enqueue(db_engine, tenant.id, "http://Queued.Example/x")
    done = _pin(db_url, "scraping", "domain", "set", "Slow.Example", "--rps", "0.5")
    assert done.exit_code == 0, done.output
    done = _pin(db_url, "scraping", "domain", "set", "slow.example", "--concurrency", "1")
    assert done.exit_code == 0, done.output
    listed = _pin(db_url, "scraping", "domain", "list")
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0].startswith("queued.example\t2 rps (default)\t4 concurrent (default)\t0 running")
    assert lines[1].startswith("slow.example\t0.5 rps\t1 concurrent\t0 running\t0 queued")

    refused = _pin(db_url, "scraping", "domain", "set", "slow.example", "--rps", "0")
    assert refused.exit_code != 0 and "--rps" in refused.output

    assert _pin(db_url, "tenant", "set-weight", "shop", "3").exit_code == 0
    with db_engine.connect() as conn:
        weight = conn.execute(text("SELECT weight FROM scraping.tenants")).scalar_one()
    assert weight == 3
    unknown = _pin(db_url, "tenant", "set-weight", "nobody", "3")
    assert unknown.exit_code != 0 and "nobody" in unknown.output


# --- concurrent claimers (issue 15) ------------------------------------------------------


def _claimer_process(db_url: str, worker: str, claims: int, ready: Any, go: Any, out: Any) -> None:
    """One claimer process: `claims` claims of 10, every claim's jobs sent back."""
    engine = create_db_engine(db_url)
    try:
        ready.put(worker)
        go.wait(60)
        for _ in range(claims):
            batch = claim_rows(engine, worker, 10)
            out.put((worker, [(str(j.id), j.domain, j.priority) for j in batch]))
    finally:
        out.put((worker, None))
        engine.dispose()


def claim_rows(engine: Engine, worker: str, limit: int) -> list[ClaimedJob]:
    return claim_due_jobs(
        engine, worker=worker, limit=limit, lease_seconds=600, domain_defaults=UNLIMITED
    )


def test_four_claimer_processes_keep_6_3_1_and_the_domain_limits_and_claim_each_job_once(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    """docs/jobs/scraping.md's guarantee under N concurrent claimers: every claim continues
    the class sequence from the state last written, so each claim of ten picks is exactly
    6:3:1 while all classes have work; a domain's concurrency and rate hold across
    claimers; no job is claimed twice."""
    import multiprocessing

    shop, crawler = make_tenant("shop")[0], make_tenant("crawler")[0]
    enqueue_many(db_engine, shop.id, spread("high", 400), "high")
    enqueue_many(db_engine, shop.id, spread("normal", 300), "normal")
    enqueue_many(db_engine, shop.id, spread("low", 100), "low")
    set_domain_limits(db_engine, "narrow.example", rps=None, concurrency=3)
    set_domain_limits(db_engine, "rated.example", rps=2, concurrency=None)
    # The crawler's jobs have the oldest tags in their class: picked first while they can.
    enqueue_many(db_engine, crawler.id, [f"http://narrow.example/{i}" for i in range(30)])
    enqueue_many(db_engine, crawler.id, [f"http://rated.example/{i}" for i in range(30)])

    context = multiprocessing.get_context("spawn")
    ready, out, go = context.Queue(), context.Queue(), context.Event()
    processes = [
        context.Process(target=_claimer_process, args=(db_url, f"p{i}", 12, ready, go, out))
        for i in range(4)
    ]
    batches: list[tuple[str, list[tuple[str, str, str]]]] = []
    try:
        for p in processes:
            p.start()
        for _ in processes:  # every process connected and waiting: start them together
            ready.get(timeout=120)
        go.set()
        finished = 0
        while finished < len(processes):
            worker, batch = out.get(timeout=120)
            if batch is None:
                finished += 1
            else:
                batches.append((worker, batch))
        for p in processes:
            p.join(timeout=30)
    finally:
        for p in processes:
            if p.is_alive():
                p.terminate()
                p.join()
    assert all(p.exitcode == 0 for p in processes)

    claimed = [job for _, batch in batches for job in batch]
    assert len(claimed) == len({job_id for job_id, _, _ in claimed}) == 4 * 12 * 10
    for worker, batch in batches:
        assert Counter(priority for _, _, priority in batch) == Counter(high=6, normal=3, low=1), (
            worker
        )
    by_domain = Counter(domain for _, domain, _ in claimed)
    assert by_domain["narrow.example"] == 3  # its 3 connections, never a 4th
    # rated.example: a burst of 2 plus 2/s for as long as the claims ran (seconds).
    with db_engine.connect() as conn:
        starts = conn.execute(
            text(
                "SELECT extract(epoch FROM started_at) FROM scraping.jobs "
                "WHERE domain = 'rated.example' AND status = 'running' ORDER BY started_at"
            )
        ).scalars()
        rated = [float(s) for s in starts]
        running_narrow = conn.execute(
            text(
                "SELECT count(*) FROM scraping.jobs WHERE domain = 'narrow.example' "
                "AND status = 'running'"
            )
        ).scalar_one()
    assert running_narrow == 3
    assert len(rated) == by_domain["rated.example"] >= 2
    assert _most_in_any_window(rated, rps=2, burst=2, slack=0.0)


# --- intake from SQL (issue 15) ----------------------------------------------------------


def _submit(conn: Any, *args: Any, **named: Any) -> uuid.UUID:
    placeholders = [f":a{i}" for i in range(len(args))] + [f"{k} => :{k}" for k in named]
    params = {f"a{i}": a for i, a in enumerate(args)} | named
    return conn.execute(
        text(f"SELECT scraping.submit_job({', '.join(placeholders)})"), params
    ).scalar_one()


@pytest.mark.parametrize(
    ("args", "named", "argument"),
    [
        ((uuid.uuid4(), "http://a.example/"), {}, "p_tenant_id"),
        (("TENANT", "ftp://a.example/"), {}, "p_url"),
        (("TENANT", "http:///nohost"), {}, "p_url"),
        (("TENANT", "http://a.example/" + "x" * 2048), {}, "p_url"),
        (("TENANT", "http://a.example/a b"), {}, "p_url"),
        (("TENANT", "http://a.example:99999/"), {}, "p_url"),
        (("TENANT", None), {}, "p_url"),
        (("TENANT", "http://a.example/"), {"p_params": "[1]"}, "p_params"),
        (("TENANT", "http://a.example/"), {"p_priority": "urgent"}, "p_priority"),
        (("TENANT", "http://a.example/"), {"p_callback_url": "mailto:x@y"}, "p_callback_url"),
        (("TENANT", "http://a.example/"), {"p_idempotency_key": "k" * 256}, "p_idempotency_key"),
    ],
)
def test_submit_job_refuses_bad_arguments_naming_them(
    db_engine: Engine, make_tenant, args: tuple[Any, ...], named: dict[str, Any], argument: str
) -> None:
    from sqlalchemy.exc import DBAPIError

    tenant, _ = make_tenant("shop")
    args = tuple(tenant.id if a == "TENANT" else a for a in args)
    with pytest.raises(DBAPIError) as caught, db_engine.begin() as conn:
        if "p_params" in named:
            conn.execute(
                text("SELECT scraping.submit_job(:t, :u, p_params => CAST(:p AS jsonb))"),
                {"t": args[0], "u": args[1], "p": named["p_params"]},
            )
        else:
            _submit(conn, *args, **named)
    assert caught.value.orig.sqlstate == "22023"
    assert argument in str(caught.value.orig)
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one() == 0


def test_submit_job_is_idempotent_by_key_and_names_a_reused_key(
    db_engine: Engine, make_tenant
) -> None:
    from sqlalchemy.exc import DBAPIError

    tenant, _ = make_tenant("shop")
    with db_engine.begin() as conn:
        first = _submit(conn, tenant.id, "http://a.example/1", p_idempotency_key="order-1")
        again = _submit(conn, tenant.id, "http://a.example/1", p_idempotency_key="order-1")
    assert first == again
    with pytest.raises(DBAPIError) as caught, db_engine.begin() as conn:
        _submit(conn, tenant.id, "http://a.example/2", p_idempotency_key="order-1")
    assert caught.value.orig.sqlstate == "23505" and "'order-1'" in str(caught.value.orig)
    # The Python helper (POST /jobs) goes through it: same key, same job, replayed.
    request = JobRequest(url="http://a.example/1", params={})
    replay = repository.submit_job(db_engine, tenant.id, request, "order-1")
    assert (replay.id, replay.replayed) == (first, True)
    other = JobRequest(url="http://a.example/3", params={})
    with pytest.raises(repository.IdempotencyKeyReused):
        repository.submit_job(db_engine, tenant.id, other, "order-1")
    fresh = repository.submit_job(db_engine, tenant.id, other, None)
    assert fresh.replayed is False and fresh.status == "queued"


def test_submit_job_in_a_producers_transaction_exists_exactly_when_it_commits(
    db_engine: Engine, make_tenant
) -> None:
    tenant, _ = make_tenant("shop")
    with db_engine.connect() as conn:
        with conn.begin() as transaction:
            rolled_back = _submit(conn, tenant.id, "http://a.example/rolled-back")
            transaction.rollback()
        with conn.begin():  # set-based, in the producer's own transaction
            conn.execute(
                text(
                    "SELECT scraping.submit_job(:t, 'http://set-' || n || '.example/') "
                    "FROM generate_series(1, 3) AS n"
                ),
                {"t": tenant.id},
            )
    picked = claim(db_engine, 10)
    assert sorted(j.domain for j in picked) == ["set-1.example", "set-2.example", "set-3.example"]
    assert rolled_back not in {j.id for j in picked}
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one() == 3


def test_a_tenant_inserted_with_only_its_required_columns_is_scheduled_at_weight_1(
    db_engine: Engine, make_tenant
) -> None:
    shop, _ = make_tenant("shop")
    bare = uuid.uuid4()
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix) "
                "VALUES (:id, 'bare', '\\x01', 'pin_0001')"
            ),
            {"id": bare},
        )
        for tenant_id, name in ((bare, "bare"), (shop.id, "shop")):
            conn.execute(
                text(
                    "SELECT scraping.submit_job(:t, 'http://' || :n || '-' || g || '.example/') "
                    "FROM generate_series(1, 20) AS g"
                ),
                {"t": tenant_id, "n": name},
            )
    picked = Counter(j.tenant_id for j in claim(db_engine, 20))
    assert picked == {bare: 10, shop.id: 10}


# --- pauses, cancels, leases (issue 15) ----------------------------------------------------


def test_a_pause_is_capped_and_an_operator_can_pause_and_resume_a_domain(
    db_url: str, db_engine: Engine, make_tenant
) -> None:
    tenant, _ = make_tenant("shop")
    enqueue(db_engine, tenant.id, "http://held.example/1")
    with db_engine.begin() as conn:  # Retry-After: Fri, 31 Dec 9999 …
        kept_for = conn.execute(
            text(
                "SELECT extract(epoch FROM scraping.pause_domain("
                "'held.example', '9999-12-31 23:59:59+00') - now())"
            )
        ).scalar_one()
    # PIN_SCRAPING_MAX_PAUSE_SECONDS' default (from the function's clock, a moment later)
    assert 3590 <= kept_for <= 3601
    assert claim(db_engine, 5) == []

    resumed = _pin(db_url, "scraping", "domain", "resume", "Held.Example")
    assert resumed.exit_code == 0 and "resumed" in resumed.output, resumed.output
    [job] = claim(db_engine, 5)
    assert job.domain == "held.example"

    enqueue(db_engine, tenant.id, "http://held.example/2")
    paused = CliRunner().invoke(
        main,
        ["scraping", "domain", "pause", "held.example", "--for", "10m"],
        env={"PIN_DATABASE_URL": db_url, "PIN_SCRAPING_MAX_PAUSE_SECONDS": "300"},
    )
    assert paused.exit_code == 0 and "capped" in paused.output, paused.output
    with db_engine.connect() as conn:
        paused_for = conn.execute(
            text(
                "SELECT extract(epoch FROM blocked_until - now()) FROM scraping.domains "
                "WHERE domain = 'held.example'"
            )
        ).scalar_one()
    assert 290 <= paused_for <= 300
    assert claim(db_engine, 5) == []
    listed = _pin(db_url, "scraping", "domain", "list")
    assert "held.example" in listed.output and "paused until" in listed.output
    refused = _pin(db_url, "scraping", "domain", "pause", "held.example", "--for", "soon")
    assert refused.exit_code != 0 and "duration" in refused.output


def test_a_job_with_a_cancel_request_is_never_claimed_again(db_engine: Engine, make_tenant) -> None:
    tenant, _ = make_tenant("shop")
    job_id = enqueue(db_engine, tenant.id, "http://a.example/1")
    [job] = claim(db_engine, 5)
    assert repository.cancel_job(db_engine, tenant.id, job_id) == ("running", True)
    # Its attempt ends as a retry (a worker that had not seen the request yet).
    outcome = leases.AttemptOutcome(
        job_id=job_id, attempt=job.attempt, status="queued", outcome="retry"
    )
    leases.finish_attempts(db_engine, worker="w", outcomes=[outcome])
    assert claim(db_engine, 5) == []


def test_a_lease_is_stamped_when_the_claim_runs_not_when_its_transaction_began(
    db_engine: Engine, make_tenant
) -> None:
    tenant, _ = make_tenant("shop")
    enqueue(db_engine, tenant.id, "http://a.example/1")
    with db_engine.begin() as conn:
        began = conn.execute(text("SELECT now()")).scalar_one()
        conn.execute(text("SELECT pg_sleep(0.3)"))
        row = conn.execute(
            text(
                "SELECT started_at, lease_expires_at FROM scraping.claim_jobs('w', 1, 60, 100, 10)"
            )
        ).one()
    assert (row.started_at - began).total_seconds() >= 0.3
    assert (row.lease_expires_at - row.started_at).total_seconds() == 60


def test_a_domain_whose_row_another_claim_holds_is_passed_over_not_waited_for(
    db_engine: Engine, make_tenant
) -> None:
    """A claim holding a domain's state row (it picked from that domain's other class)
    keeps the domain: a second claim neither waits for it nor picks from it, and takes the
    next domain instead; once the first ends the domain is claimable again."""
    tenant, _ = make_tenant("shop")
    held = enqueue(db_engine, tenant.id, "http://held.example/1")
    other = enqueue(db_engine, tenant.id, "http://other.example/1")
    with db_engine.connect() as holder:
        holder.execute(
            text("SELECT 1 FROM scraping.domains WHERE domain = 'held.example' FOR UPDATE")
        )
        with db_engine.begin() as conn:
            # Waiting for the holder would fail here, not hang.
            conn.execute(text("SET LOCAL lock_timeout = '5s'"))
            got = (
                conn.execute(text("SELECT id FROM scraping.claim_jobs('w', 2, 60, 100, 10)"))
                .scalars()
                .all()
            )
        assert got == [other]
        holder.rollback()
    assert [job.id for job in claim(db_engine, 2)] == [held]


def test_a_job_requeued_while_a_claim_empties_its_queue_stays_claimable(
    db_engine: Engine, make_tenant
) -> None:
    """A claim that takes a queue's last queued job deletes the queue when it ends. A job of
    that queue going back to queued meanwhile (a retry, a lease swept) must not be lost to
    that delete: its announcement waits for the claim and then makes the queue again.
    Before, the announcement saw the queue still there, wrote nothing, and the claim's
    delete left the job queued in no queue: never claimed again (the quick fault suite's
    scraping scenarios stalled on it)."""
    tenant, _ = make_tenant("shop")
    running, last = (enqueue(db_engine, tenant.id, f"http://one.example/{n}") for n in (1, 2))
    assert [job.id for job in claim(db_engine, 1)] == [running]
    requeued = threading.Event()

    def requeue() -> None:
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE scraping.jobs SET status = 'queued', lease_owner = NULL, "
                    "lease_expires_at = NULL, next_attempt_at = now() WHERE id = :id"
                ),
                {"id": running},
            )
        requeued.set()

    with db_engine.connect() as claimer:
        got = claimer.execute(text("SELECT id FROM scraping.claim_jobs('w', 1, 60, 100, 10)"))
        assert got.scalars().all() == [last]  # the queue's last job: the queue goes at commit
        other = threading.Thread(target=requeue)
        other.start()

        # Its announcement waits on the claim's row lock on the queue (before the fix it did
        # not wait, and this gate failed).
        wait_until_blocked(db_engine, "transactionid")
        claimer.commit()
    other.join(120)
    assert requeued.is_set()
    assert [job.id for job in claim(db_engine, 1)] == [running]


def test_a_domains_connection_count_cannot_scan_every_running_job(db_engine: Engine) -> None:
    """The claim counts a domain's connections with `status = 'running' AND domain = …`.
    While the statistics say nothing is running (analysed before a burst), that count's
    generic plan could pick ix_jobs_lease (smaller than ix_jobs_running_domain, both looking
    empty) and read every running job: 2.2 ms and ~2,000 blocks a count at 4 claimers in
    bench/scheduler_cases.py. The lease index serves only lease comparisons (0021); the lease
    sweep still reads it."""
    count = (
        "EXPLAIN SELECT count(*) FROM scraping.jobs j "
        "WHERE j.status = 'running' AND j.domain = 'a.example'"
    )
    sweep = (
        "EXPLAIN SELECT id FROM scraping.jobs WHERE status = 'running' "
        "AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT 100"
    )
    with db_engine.connect() as conn:
        # Only the lease index left to serve the count: whether it can is the question.
        conn.execute(text("DROP INDEX scraping.ix_jobs_running_domain"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        count_plan = "\n".join(conn.execute(text(count)).scalars())
        sweep_plan = "\n".join(conn.execute(text(sweep)).scalars())
        conn.rollback()
    assert "ix_jobs_lease" not in count_plan, count_plan
    assert "ix_jobs_lease" in sweep_plan, sweep_plan


def test_a_claims_token_spend_is_a_heap_only_update(db_engine: Engine, make_tenant) -> None:
    """Every pick spends a token of its domain: an UPDATE of scraping.domains' tokens and
    tokens_at. No index covers them (0022 dropped 0007's ix_domains_tokens_at, which no
    claim since 0011 reads) and the table leaves room on its pages, so the spend is a
    heap-only update: no new entry in the domain's primary key for the next claimer's
    lookup to step over, 20,000 domains' worth of upkeep gone at 4 claimers."""
    tenant, _ = make_tenant("crawler")
    enqueue_many(db_engine, tenant.id, [f"http://a.example/{n}" for n in range(3)])
    with db_engine.connect() as conn:
        claimed = conn.execute(text("SELECT id FROM scraping.claim_jobs('w', 3, 60, 100, 10)"))
        assert len(claimed.all()) == 3
        updates, hot = conn.execute(
            text(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
                "WHERE schemaname = 'scraping' AND relname = 'domains'"
            )
        ).one()
        conn.rollback()
    assert (updates, hot) == (1, 1)
