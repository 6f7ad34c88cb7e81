"""robots.txt (RFC 9309) and Crawl-delay, obeyed by every worker, checked at the target:
what reached the loopback site is the evidence (docs/jobs/scraping.md, "Politeness")."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from sqlalchemy import Engine, event, text

from pin_orchestration.areas import metrics_registry
from pin_orchestration.cli import main as cli
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.fetch.robots_rules import (
    MAX_TTL_SECONDS,
    MIN_TTL_SECONDS,
    origin_of,
    ttl_seconds,
)
from pin_orchestration.scraping.policies import fetch_policy_from, retry_policy_from
from pin_orchestration.scraping.store import leases, politeness, repository
from pin_orchestration.scraping.store.local import LocalResultStore
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.worker.options import WorkerOptions
from pin_orchestration.scraping.worker.run import claim_due_jobs, run_worker
from pin_orchestration.scraping.worker.wait_reasons import explain
from tests.scraping.conftest import TEST_SETTINGS, Worker, _with_allowed
from tests.scraping.test_metrics import samples

RULES = (
    # Everyone else is kept out; our product token's group lets us in except /page/private.
    "User-agent: *\nDisallow: /\n\nUser-agent: pin-scraper\nDisallow: /page/private\nAllow: /\n"
)


def submit(engine: Engine, tenant_id: uuid.UUID, url: str) -> uuid.UUID:
    return repository.submit_job(engine, tenant_id, JobRequest(url=url, params={}), None).id


def job(engine: Engine, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT status, last_error_class, last_error FROM scraping.jobs WHERE id = :id"),
            {"id": job_id},
        ).one()


def attempts(engine: Engine, job_id: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT outcome, error_class, error_detail FROM scraping.job_attempts "
                "WHERE job_id = :id ORDER BY number"
            ),
            {"id": job_id},
        ).all()


def test_a_disallowed_path_is_never_requested_and_an_allowed_one_is_fetched(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    site.robots = [(200, RULES, {})]
    tenant, _ = make_tenant("shop")
    private = submit(db_engine, tenant.id, f"{site.url}/page/private-1")
    public = submit(db_engine, tenant.id, f"{site.url}/page/public")
    # A redirect hop into the disallowed path ends the same way, the hop never sent.
    hop = submit(db_engine, tenant.id, f"{site.url}/redirect?to=/page/private-2")

    work()

    assert site.count("/page/private-1") == 0
    assert site.count("/page/private-2") == 0
    assert site.count("/page/public") == 1
    assert site.count("/robots.txt") == 1
    assert site.all_requests[0] == "/robots.txt"
    assert job(db_engine, public).status == "succeeded"
    for disallowed in (private, hop):
        row = job(db_engine, disallowed)
        assert (row.status, row.last_error_class) == ("failed", "robots_disallowed")
        # one attempt, permanent: no retry
        [attempt] = attempts(db_engine, disallowed)
        assert (attempt.outcome, attempt.error_class) == ("failed", "robots_disallowed")
        assert "Disallow: /page/private" in attempt.error_detail
        assert "User-agent: pin-scraper" in attempt.error_detail
    # counted by class with every other failure: 2 of the 3 attempts
    got = samples(generate_latest(metrics_registry(db_engine)).decode())
    share = got[("scraping_failure_share_by_class", (("error_class", "robots_disallowed"),))]
    assert share == pytest.approx(2 / 3)


def test_a_robots_txt_that_is_not_found_allows_everything(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    assert site.robots == []  # 404
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(5)]

    work()

    assert {job(db_engine, i).status for i in ids} == {"succeeded"}
    assert site.count("/robots.txt") == 1
    assert site.all_requests[0] == "/robots.txt"


def test_an_unreachable_robots_txt_keeps_every_job_of_its_host_away_until_it_answers(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    # 503 twice, then rules that allow everything
    site.robots = [(503, "busy", {}), (503, "busy", {}), (200, "User-agent: *\nAllow: /\n", {})]
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(4)]

    work(idle_exit_seconds=2.0)

    # nothing but robots.txt reached the host before robots.txt answered
    assert site.all_requests[:3] == ["/robots.txt"] * 3
    assert site.count("/robots.txt") == 3
    assert {job(db_engine, i).status for i in ids} == {"succeeded"}
    handed_back = [a for i in ids for a in attempts(db_engine, i) if a.outcome == "retry"]
    assert handed_back and {a.error_class for a in handed_back} == {"robots_unreachable"}
    with db_engine.connect() as conn:
        robots = conn.execute(text("SELECT state, failures FROM scraping.robots")).one()
    assert (robots.state, robots.failures) == ("rules", 0)


def test_robots_txt_is_fetched_once_per_host_for_two_worker_processes(
    db_url: str, db_engine: Engine, make_tenant, site: ScrapingTarget, tmp_path: Path
) -> None:
    """Both processes hold jobs of the host before its robots.txt answers (the answer is
    held until they do): the one fetch is both processes'."""
    gate = threading.Event()
    site.robots = [(200, "User-agent: *\nDisallow: /page/no\n", {})]
    site.robots_gate = gate
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(30)]
    refused = [submit(db_engine, tenant.id, f"{site.url}/page/no-{n}") for n in range(5)]
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_HOME": str(tmp_path),
        "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32",
        "PIN_SCRAPING_FETCH_TIMEOUT_SECONDS": "20",
        "PIN_SCRAPING_DOMAIN_CONCURRENCY": "100",
        "PIN_SCRAPING_DOMAIN_RPS": "1000",
    }
    command = [
        sys.executable,
        "-m",
        "pin_orchestration.cli",
        "scraping",
        "work",
        "--slots",
        "4",
        "--idle-exit-seconds",
        "1",
    ]
    workers = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 180  # two `pin` processes starting on a starved core
        while True:
            with db_engine.connect() as conn:
                owners = conn.execute(
                    text(
                        "SELECT count(DISTINCT worker) FROM scraping.job_attempts "
                        "WHERE outcome IS NULL"
                    )
                ).scalar()
            if owners == 2:
                break
            for w in workers:
                assert w.poll() is None, w.stderr.read().decode()
            assert time.monotonic() < deadline, "both workers never held jobs at once"
            time.sleep(0.05)
        assert site.count("/robots.txt") <= 1
        gate.set()
        for w in workers:
            assert w.wait(timeout=120) == 0, w.stderr.read().decode()
    finally:
        gate.set()
        for w in workers:
            if w.poll() is None:
                w.kill()
    assert site.count("/robots.txt") == 1
    assert {job(db_engine, i).status for i in ids} == {"succeeded"}
    assert {job(db_engine, i).last_error_class for i in refused} == {"robots_disallowed"}
    assert not any(r.startswith("/page/no") for r in site.requests)


def test_crawl_delay_spaces_the_starts_on_its_host_across_two_workers(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    site.robots = [(200, "User-agent: *\nCrawl-delay: 2\n", {})]
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(3)]

    runs = [threading.Thread(target=work, kwargs={"idle_exit_seconds": 3.0}) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()

    assert {job(db_engine, i).status for i in ids} == {"succeeded"}
    starts = sorted(s.arrived for s in site.served if s.path.startswith("/page/"))
    assert len(starts) == 3
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 2.0, gaps
    [host] = [d for d in politeness.list_domains(db_engine) if d["domain"] == "127.0.0.1"]
    # 1 / Crawl-delay, the delay stretched by a tenth for the way from a turn to the host
    assert host["crawl_delay"] == 2.0
    assert abs(host["rps"] - 1 / 2.2) < 1e-9
    shown = CliRunner().invoke(
        cli, ["scraping", "domain", "list"], env={"PIN_DATABASE_URL": str(db_engine.url)}
    )
    assert "Crawl-delay 2 s" in shown.output, shown.output


def test_an_operator_exempts_a_host_and_its_jobs_are_fetched_despite_a_disallow(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    site.robots = [(200, "User-agent: *\nDisallow: /\n", {})]
    url = db_engine.url.render_as_string(hide_password=False)
    exempted = CliRunner().invoke(
        cli,
        ["scraping", "domain", "robots", "127.0.0.1", "--ignore", "--reason", "our own site"],
        env={"PIN_DATABASE_URL": url},
    )
    assert exempted.exit_code == 0, exempted.output
    tenant, _ = make_tenant("shop")
    allowed = submit(db_engine, tenant.id, f"{site.url}/page/anything")

    work()

    assert job(db_engine, allowed).status == "succeeded"
    assert site.count("/robots.txt") == 0
    [host] = [d for d in politeness.list_domains(db_engine) if d["domain"] == "127.0.0.1"]
    assert (host["robots_mode"], host["robots_reason"]) == ("ignore", "our own site")
    assert host["robots_set_by"]

    # --obey: the next job is judged by the robots.txt again
    CliRunner().invoke(
        cli,
        ["scraping", "domain", "robots", "127.0.0.1", "--obey", "--reason", "done"],
        env={"PIN_DATABASE_URL": url},
    )
    refused = submit(db_engine, tenant.id, f"{site.url}/page/other")
    work()
    assert job(db_engine, refused).last_error_class == "robots_disallowed"
    assert site.count("/page/other") == 0


def test_robots_ignore_fetches_no_robots_txt(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    site.robots = [(200, "User-agent: *\nDisallow: /\n", {})]
    tenant, _ = make_tenant("shop")
    allowed = submit(db_engine, tenant.id, f"{site.url}/page/x")

    work(settings=dataclasses.replace(TEST_SETTINGS, robots="ignore"))

    assert job(db_engine, allowed).status == "succeeded"
    assert site.count("/robots.txt") == 0


def test_the_cache_lifetime_follows_max_age_within_a_day() -> None:
    assert ttl_seconds({}) == MAX_TTL_SECONDS
    assert ttl_seconds({"cache-control": "public, max-age=600"}) == 600
    assert ttl_seconds({"cache-control": "max-age=99999999"}) == MAX_TTL_SECONDS
    assert ttl_seconds({"cache-control": "max-age=0"}) == MIN_TTL_SECONDS
    assert ttl_seconds({"cache-control": "max-age=soon"}) == MAX_TTL_SECONDS
    assert ttl_seconds({"cache-control": "max-age=nan"}) == MAX_TTL_SECONDS
    assert ttl_seconds({"cache-control": "max-age=inf"}) == MAX_TTL_SECONDS


def test_an_origin_is_scheme_host_and_port() -> None:
    assert origin_of("http://Example.COM/a?b") == "http://example.com:80"
    assert origin_of("https://example.com:8443/") == "https://example.com:8443"
    assert origin_of("http://[::1]:81/x") == "http://[::1]:81"


def test_waiting_on_robots_txt_spends_none_of_the_jobs_attempts(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    """A job handed back because its host's robots.txt did not answer (or was still being
    fetched) sent nothing to its URL: that is no attempt of the job. Counted against its
    budget, two robots.txt 503s and one real 500 failed a job allowed two attempts, its URL
    asked once."""
    site.robots = [(503, "busy", {}), (503, "busy", {}), (200, "User-agent: *\nAllow: /\n", {})]
    tenant, _ = make_tenant("shop")
    # 500 on its first request, 200 on its second
    job_id = submit(db_engine, tenant.id, f"{site.url}/script/budget?steps=500,200")

    work(settings=dataclasses.replace(TEST_SETTINGS, max_attempts=2), idle_exit_seconds=2.0)

    assert site.count("/robots.txt") == 3
    assert site.count("/script/budget") == 2
    outcomes = [(a.outcome, a.error_class) for a in attempts(db_engine, job_id)]
    assert outcomes[:2] == [("retry", "robots_unreachable")] * 2
    assert job(db_engine, job_id).status == "succeeded", outcomes


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        # PostgreSQL's text holds no NUL: storing the body failed, the job became a
        # worker_error and every job of the host asked for robots.txt again
        ("User-agent: *\nDisallow: /page/private\x00\n", {}),
        # float("nan") is a number to Python and no interval to PostgreSQL: the same
        ("User-agent: *\nDisallow: /page/private\n", {"Cache-Control": "max-age=nan"}),
        # a UTF-8 byte order mark hid the first User-agent line from the parser: its
        # group's Disallow was not obeyed
        ("\ufeffUser-agent: *\nDisallow: /page/private\n", {}),
    ],
    ids=["nul-byte", "max-age-nan", "byte-order-mark"],
)
def test_a_hostile_robots_txt_is_stored_once_and_obeyed(
    db_engine: Engine,
    make_tenant,
    site: ScrapingTarget,
    work: Worker,
    body: str,
    headers: dict[str, str],
) -> None:
    site.robots = [(200, body, headers)]
    tenant, _ = make_tenant("shop")
    public = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(3)]
    private = submit(db_engine, tenant.id, f"{site.url}/page/private-1")

    work()

    assert site.count("/robots.txt") == 1
    assert site.count("/page/private-1") == 0
    assert {job(db_engine, i).status for i in public} == {"succeeded"}
    row = job(db_engine, private)
    assert (row.status, row.last_error_class) == ("failed", "robots_disallowed")


@pytest.mark.parametrize("skew_hours", [1, -1], ids=["ahead", "behind"])
def test_a_worker_clock_off_by_an_hour_neither_cuts_nor_stretches_a_robots_pause(
    db_engine: Engine,
    make_tenant,
    site: ScrapingTarget,
    local_store: LocalResultStore,
    skew_hours: int,
) -> None:
    """An unreachable robots.txt's next try is PostgreSQL's time (scraping.robots
    expires_at); the hand-back turned it into a delay with the worker's own clock. An hour
    ahead, the job was due and its host unpaused at once (claimed and handed back again
    and again until the next try); an hour behind, the job waited an hour more. The next
    try is 10 minutes off: no starved run reaches it, and an hour's skew still crosses it."""
    site.robots = [(503, "busy", {})]
    tenant, _ = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, f"{site.url}/page/a")
    settings = dataclasses.replace(
        _with_allowed(TEST_SETTINGS, "127.0.0.1/32"), robots_retry_seconds=600.0
    )
    skew = timedelta(hours=skew_hours)
    with Fetcher(fetch_policy_from(settings)) as fetcher:
        run_worker(
            db_engine,
            local_store,
            fetcher,
            retry_policy_from(settings),
            WorkerOptions(
                slots=2,
                lease_seconds=settings.lease_seconds,
                idle_exit_seconds=0.5,
                # Ends the run of the clock ahead, whose job is due again and again.
                max_run_duration_seconds=3,
                poll_seconds=0.05,
                domain_rps=settings.domain_rps,
                domain_concurrency=settings.domain_concurrency,
                robots_retry_seconds=settings.robots_retry_seconds,
            ),
            clock=lambda: datetime.now(UTC) + skew,
        )
    with db_engine.connect() as conn:
        retry_in, paused_for = conn.execute(
            text(
                "SELECT extract(epoch FROM j.next_attempt_at - now()),"
                "       extract(epoch FROM d.blocked_until - now())"
                " FROM scraping.jobs j LEFT JOIN scraping.domains d ON d.domain = j.domain"
                " WHERE j.id = :id"
            ),
            {"id": job_id},
        ).one()
    assert [(a.outcome, a.error_class) for a in attempts(db_engine, job_id)] == [
        ("retry", "robots_unreachable")
    ]
    # held by its host's pause (an exemption lifts it), not by its own due time
    assert float(retry_in) <= 0.5
    assert paused_for is not None and 0 < float(paused_for) <= 600.0


@pytest.mark.parametrize(
    ("delay", "stored", "rps"),
    [("1.7e308", 86400.0, 0.01), ("1e-320", None, None), ("0", None, None)],
    ids=["huge", "denormal", "zero"],
)
def test_an_absurd_crawl_delay_is_stored_once_within_bounds(
    db_engine: Engine,
    make_tenant,
    site: ScrapingTarget,
    work: Worker,
    delay: str,
    stored: float | None,
    rps: float | None,
) -> None:
    """1 / (Crawl-delay x 1.1) overflowed PostgreSQL's double precision for 1.7e308 and for
    a denormal 1e-320 ("value out of range"): the store failed, each job became a
    worker_error and asked for robots.txt again. A delay is kept within a day; one too
    small to be a delay caps nothing."""
    site.robots = [(200, f"User-agent: *\nCrawl-delay: {delay}\n", {})]
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(2)]

    work()

    assert site.count("/robots.txt") == 1
    classes = {a.error_class for i in ids for a in attempts(db_engine, i)}
    assert "worker_error" not in classes, classes
    hosts = [d for d in politeness.list_domains(db_engine) if d["domain"] == "127.0.0.1"]
    assert (hosts[0]["crawl_delay"] if hosts else None) == stored
    if rps is not None:
        assert hosts[0]["rps"] == rps
    else:
        assert {job(db_engine, i).status for i in ids} == {"succeeded"}


@pytest.mark.parametrize(
    "ours",
    ["pin", "p", "pin-s"],
)
def test_a_group_of_another_crawler_whose_name_begins_ours_is_not_ours(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker, ours: str
) -> None:
    """RFC 9309 section 2.2.1: the group is the one whose user-agent is our product token
    (case-insensitively), else `*`. protego takes any group whose name starts ours
    (`pin` for `pin-scraper`, made for full User-Agent headers): another crawler's Allow
    let us into what `*` disallows."""
    site.robots = [
        (200, f"User-agent: {ours}\nAllow: /\n\nUser-agent: *\nDisallow: /page/no\n", {})
    ]
    tenant, _ = make_tenant("shop")
    refused = submit(db_engine, tenant.id, f"{site.url}/page/no-1")

    work()

    assert site.count("/page/no-1") == 0
    assert job(db_engine, refused).last_error_class == "robots_disallowed"
    [attempt] = attempts(db_engine, refused)
    assert "(group User-agent: *)" in attempt.error_detail


def test_our_group_is_found_by_its_product_token_in_any_case_or_with_a_version(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    site.robots = [
        (200, "User-agent: *\nAllow: /\n\nUser-agent: PIN-Scraper/2.0\nDisallow: /page/no\n", {})
    ]
    tenant, _ = make_tenant("shop")
    refused = submit(db_engine, tenant.id, f"{site.url}/page/no-1")
    allowed = submit(db_engine, tenant.id, f"{site.url}/page/yes")

    work()

    assert site.count("/page/no-1") == 0
    assert job(db_engine, refused).last_error_class == "robots_disallowed"
    assert job(db_engine, allowed).status == "succeeded"


@pytest.mark.parametrize(
    "path",
    [
        # %2E is '.', unreserved: the fetcher sends it decoded, and a server resolves the
        # '..' it makes; the check saw a path outside /page/private
        "/page/%2E%2E/page/private-1",
        "/x/%2e%2e/page/private-2",
        "/x/.%2e/page/private-3",
        # most servers merge slashes (nginx by default)
        "//page/private-4",
        "/page//private-5",
    ],
)
def test_a_path_a_server_resolves_into_a_disallowed_one_is_not_requested(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker, path: str
) -> None:
    """A client writes a disallowed path so that the check does not see it: the URL is
    judged as the server will read it too (unreserved characters decoded, dot segments
    resolved, slashes merged), and refused when either reading is disallowed."""
    site.robots = [(200, "User-agent: *\nDisallow: /page/private\n", {})]
    tenant, _ = make_tenant("shop")
    refused = submit(db_engine, tenant.id, f"{site.url}{path}")
    allowed = submit(db_engine, tenant.id, f"{site.url}/page/x/%2e%2e/public")

    work()

    assert site.all_requests[0] == "/robots.txt"
    assert not any("private" in r for r in site.all_requests), site.all_requests
    assert job(db_engine, refused).last_error_class == "robots_disallowed"
    assert job(db_engine, allowed).status == "succeeded"


def test_exempting_a_host_whose_robots_txt_is_unreachable_lifts_the_pause_it_caused(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    """A partner's robots.txt answers 503: its host is paused until the next try. The
    operator exempts the host so its jobs go on; they stayed held by the robots.txt's
    pause (up to PIN_SCRAPING_MAX_PAUSE_SECONDS), and the wait still said robots_unreachable."""
    site.robots = [(503, "down", {})]
    tenant, _ = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, f"{site.url}/page/partner")
    settings = dataclasses.replace(TEST_SETTINGS, robots_retry_seconds=30)
    work(settings=settings)
    assert job(db_engine, job_id).status == "queued"

    exempted = CliRunner().invoke(
        cli,
        ["scraping", "domain", "robots", "127.0.0.1", "--ignore", "--reason", "partner API"],
        env={"PIN_DATABASE_URL": db_engine.url.render_as_string(hide_password=False)},
    )
    assert exempted.exit_code == 0, exempted.output
    work(settings=settings)

    assert job(db_engine, job_id).status == "succeeded"
    assert site.count("/page/partner") == 1
    assert site.count("/robots.txt") == 1


def test_an_exemption_reaches_a_running_worker_that_saw_the_robots_txt_unreachable(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    """A worker trusts a row it read for 5 s. Having read the robots.txt unreachable, it
    claimed the job the exemption let go, judged it by the row it remembered and paused the
    host again until the next try: the exemption undone for up to PIN_SCRAPING_MAX_PAUSE."""
    site.robots = [(503, "down", {})]
    tenant, _ = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, f"{site.url}/page/partner")
    # The pause of the robots.txt that did not answer: longer than any starved run's wait.
    settings = dataclasses.replace(TEST_SETTINGS, robots_retry_seconds=600)
    stop = threading.Event()
    run = threading.Thread(
        target=work, kwargs={"settings": settings, "stop": stop, "idle_exit_seconds": 30}
    )
    run.start()
    try:
        deadline = time.monotonic() + 120  # a bound for a broken run only
        while not [a for a in attempts(db_engine, job_id) if a.outcome == "retry"]:
            assert time.monotonic() < deadline, "the job was never handed back"
            time.sleep(0.05)
        exempted = CliRunner().invoke(
            cli,
            ["scraping", "domain", "robots", "127.0.0.1", "--ignore", "--reason", "partner"],
            env={"PIN_DATABASE_URL": db_engine.url.render_as_string(hide_password=False)},
        )
        assert exempted.exit_code == 0, exempted.output
        deadline = time.monotonic() + 120  # bounded for the failing case (600 s pause)
        while job(db_engine, job_id).status != "succeeded":
            assert time.monotonic() < deadline, attempts(db_engine, job_id)
            time.sleep(0.05)
    finally:
        stop.set()
        run.join()
    assert site.count("/page/partner") == 1


def test_a_job_claimed_before_its_hosts_crawl_delay_was_known_waits_a_turn_under_it(
    db_engine: Engine, make_tenant, site: ScrapingTarget, local_store: LocalResultStore
) -> None:
    """Claimed (its turn taken at the old rate), then another worker stores the host's
    robots.txt with Crawl-delay 2 and starts a request there; the job read that robots.txt
    fresh, so it went at once on the turn its claim took: two starts milliseconds apart
    (test_crawl_delay_spaces_the_starts_on_its_host_across_two_workers, under load)."""
    site.robots = [(200, "User-agent: *\nAllow: /\n", {})]  # never asked: stored below
    tenant, _ = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, f"{site.url}/page/late")
    other_start: list[float] = []

    def claim_then_robots_known(engine: Engine, **kwargs: Any) -> list[Any]:
        jobs = claim_due_jobs(engine, **kwargs)
        if jobs and not other_start:
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO scraping.robots (origin, domain, state, http_status, body,"
                        " crawl_delay, fetched_at, expires_at) VALUES (:origin, '127.0.0.1',"
                        " 'rules', 200, 'User-agent: *\nCrawl-delay: 2\n', 2, now(),"
                        " now() + interval '1 day')"
                    ),
                    {"origin": origin_of(site.url)},
                )
                conn.execute(
                    text(
                        "UPDATE scraping.domains SET crawl_delay = 2, robots_default_rps = 10000"
                        " WHERE domain = '127.0.0.1'"
                    )
                )
                # the other worker's request takes the host's one token now
                conn.execute(
                    text(
                        "UPDATE scraping.domains SET tokens = 0, tokens_at = clock_timestamp()"
                        " WHERE domain = '127.0.0.1'"
                    )
                )
            other_start.append(time.time())
        return jobs

    settings = dataclasses.replace(
        _with_allowed(TEST_SETTINGS, "127.0.0.1/32"), fetch_timeout_seconds=10
    )
    with Fetcher(fetch_policy_from(settings)) as fetcher:
        run_worker(
            db_engine,
            local_store,
            fetcher,
            retry_policy_from(settings),
            WorkerOptions(
                slots=2,
                lease_seconds=settings.lease_seconds,
                idle_exit_seconds=0.5,
                max_run_duration_seconds=30,
                poll_seconds=0.05,
                domain_rps=settings.domain_rps,
                domain_concurrency=settings.domain_concurrency,
            ),
            claim=claim_then_robots_known,
        )

    assert job(db_engine, job_id).status == "succeeded"
    assert site.count("/robots.txt") == 0
    [start] = [s.arrived for s in site.served if s.path == "/page/late"]
    assert start - other_start[0] >= 2.0, start - other_start[0]


def test_a_redirect_to_a_host_whose_robots_txt_is_unreachable_pauses_that_host(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    """The job's host redirects to another whose robots.txt answers 503: the pause was set
    on the job's host (every tenant's jobs there held) and not on the host that failed."""
    other = ScrapingTarget(host="127.0.0.2").start()
    try:
        other.robots = [(503, "down", {})]
        tenant, _ = make_tenant("shop")
        job_id = submit(db_engine, tenant.id, f"{site.url}/redirect?to={other.url}/page/x")
        work(
            settings=dataclasses.replace(TEST_SETTINGS, robots_retry_seconds=30),
            allowed="127.0.0.1/32,127.0.0.2/32",
        )
        assert other.requests == []
    finally:
        other.stop()
    with db_engine.connect() as conn:
        paused = dict(
            conn.execute(
                text(
                    "SELECT domain, blocked_until > now() FROM scraping.domains"
                    " WHERE domain IN ('127.0.0.1', '127.0.0.2')"
                )
            ).all()
        )
        retry_in = conn.execute(
            text("SELECT extract(epoch FROM next_attempt_at - now()) FROM scraping.jobs"),
        ).scalar_one()
    assert paused.get("127.0.0.2") is True
    assert not paused.get("127.0.0.1")
    # the job waits for that robots.txt's next try itself: its own host is not paused
    assert float(retry_in) > 20
    assert [(a.outcome, a.error_class) for a in attempts(db_engine, job_id)] == [
        ("retry", "robots_unreachable")
    ]
    explained = explain(
        db_engine, job_id, domain_defaults=leases.DomainDefaults(1.0, 1), robots_mode="obey"
    )
    assert explained is not None and explained[1] is not None
    wait = explained[1]
    assert (wait.reason, wait.cause) == ("host_paused", "robots_unreachable"), wait
    assert "redirect" in wait.message


def test_a_hosts_crawl_delay_is_the_longest_of_its_origins(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    """Two origins of one host (two ports; http and https alike) share its rate. The last
    robots.txt stored wrote the host's Crawl-delay: one without a delay, fetched after one
    with `Crawl-delay: 2`, lifted the cap for every origin of the host for a day."""
    other = ScrapingTarget().start()  # 127.0.0.1 too, another port: another origin
    try:
        site.robots = [(200, "User-agent: *\nCrawl-delay: 2\n", {})]
        other.robots = [(200, "User-agent: *\nAllow: /\n", {})]
        tenant, _ = make_tenant("shop")
        submit(db_engine, tenant.id, f"{site.url}/page/a")
        work()
        submit(db_engine, tenant.id, f"{other.url}/page/b")
        work(idle_exit_seconds=4.0)  # the host's next turn is 2.2 s after the first
        assert other.count("/robots.txt") == 1
    finally:
        other.stop()
    with db_engine.connect() as conn:
        host = conn.execute(
            text("SELECT crawl_delay, rps FROM scraping.domains WHERE domain = '127.0.0.1'")
        ).one()
    assert host.crawl_delay == 2.0
    assert abs(host.rps - 1 / 2.2) < 1e-9


def test_a_job_that_waited_for_robots_txt_takes_a_turn_of_its_host_and_owes_no_release(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    """After its host's robots.txt was fetched, a job's own request waits for a new turn of
    the host (scraping.take_redirect_slot). At the job's own host a turn is a token, not a
    connection (the claim holds that), so nothing is held and nothing is given back: no
    release_redirect_slot round trip per job (556 at the bench's first wave, each from a
    pool its 278 slots share)."""
    site.robots = [(200, "User-agent: *\nAllow: /\n", {})]
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(4)]
    takes = releases = 0

    @event.listens_for(db_engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        nonlocal takes, releases
        takes += "scraping.take_redirect_slot(" in statement
        releases += "scraping.release_redirect_slot(" in statement

    try:
        work()
    finally:
        event.remove(db_engine, "before_cursor_execute", count)
    assert {job(db_engine, i).status for i in ids} == {"succeeded"}
    assert site.count("/robots.txt") == 1
    assert takes >= 1
    assert releases == 0


def test_slots_waiting_for_the_run_s_robots_txt_fetch_look_up_a_few_times_a_second(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker, monkeypatch
) -> None:
    """The run's slots of an origin wait in the process for the one fetching its robots.txt
    and are woken the moment it is done; meanwhile each looks up only to give up (its
    wait's end, a stop), as often as the watchdog looks at a fetch (0.25 s): every 50 ms,
    a worker's 278 slots woke 5,500 times a second through a 2 s robots.txt, each a switch
    and a turn of the GIL."""
    from pin_orchestration.scraping.fetch import robots as robots_module

    gate = threading.Event()
    site.robots = [(200, "User-agent: *\nAllow: /\n", {})]
    site.robots_gate = gate
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(8)]
    looks = 0
    real = robots_module.RobotsGuard._give_up_if_late

    def give_up_if_late(origin: str, until: float, should_stop: Any) -> None:
        nonlocal looks
        looks += 1
        real(origin, until, should_stop)

    monkeypatch.setattr(
        robots_module.RobotsGuard, "_give_up_if_late", staticmethod(give_up_if_late)
    )
    run = threading.Thread(
        target=work, kwargs={"settings": dataclasses.replace(TEST_SETTINGS, slots=8)}
    )
    run.start()
    try:
        deadline = time.monotonic() + 30
        while True:  # every job claimed, one slot holding the robots.txt request
            with db_engine.connect() as conn:
                running = conn.execute(
                    text("SELECT count(*) FROM scraping.jobs WHERE status = 'running'")
                ).scalar()
            if running == 8 and site.count("/robots.txt") == 1:
                break
            assert time.monotonic() < deadline, "the jobs were never all claimed"
            time.sleep(0.02)
        before = looks
        time.sleep(1.0)  # four looks of each of the 7 waiting slots, twenty at every 50 ms
        during = looks - before
    finally:
        gate.set()
        run.join()
    assert during <= 7 * 6, during
    assert {job(db_engine, i).status for i in ids} == {"succeeded"}


def test_slots_waiting_for_their_origins_robots_txt_share_one_read_of_its_row(
    db_engine: Engine,
    make_tenant,
    site: ScrapingTarget,
    work: Worker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While robots.txt is being fetched, the run's other slots of that origin wait for the
    answer in the process, not each polling the database (556 slots read the row ~6,000
    times in the 2 s a robots.txt took, bench/scraping_workers.py), and slots that want
    the row at once take one read's answer. "At once" is a gate, not the machine's speed
    (a starved run starts its slots far apart): the first read is held until the other
    15 slots wait for it."""
    from pin_orchestration.scraping.fetch import robots_rows

    gate = threading.Event()
    site.robots = [(200, "User-agent: *\nAllow: /\n", {})]
    site.robots_gate = gate
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(16)]
    reads = 0
    waiting = threading.Condition()
    waiters = 0

    class WaitedEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            nonlocal waiters
            with waiting:
                waiters += 1
                waiting.notify_all()
            return super().wait(timeout)

    class Reading(robots_rows._Reading):
        def __init__(self) -> None:
            super().__init__()
            self.done = WaitedEvent()

    monkeypatch.setattr(robots_rows, "_Reading", Reading)

    @event.listens_for(db_engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        nonlocal reads
        if "d.robots_mode FROM scraping.domains" in statement:
            reads += 1
            if reads == 1:  # the first read waits for the other slots to want the row
                with waiting:
                    waiting.wait_for(lambda: waiters >= len(ids) - 1, timeout=120)

    run = threading.Thread(
        target=work, kwargs={"settings": dataclasses.replace(TEST_SETTINGS, slots=16)}
    )
    run.start()
    try:
        deadline = time.monotonic() + 120  # a bound for a broken run only
        while True:  # every job claimed, one slot holding the robots.txt request
            with db_engine.connect() as conn:
                running = conn.execute(
                    text("SELECT count(*) FROM scraping.jobs WHERE status = 'running'")
                ).scalar()
            if running == 16 and site.count("/robots.txt") == 1:
                break
            assert time.monotonic() < deadline, "the jobs were never all claimed"
            time.sleep(0.02)
        before, waited = reads, waiters
        time.sleep(0.5)  # ten of the waiting slots' polls each, were they polling
        during = reads - before
    finally:
        gate.set()
        run.join()
        event.remove(db_engine, "before_cursor_execute", count)
    # The 15 slots that wanted the row while the first read was in flight took its
    # answer, and none read again while the robots.txt was fetched. One each would be 16,
    # polling every 50 ms hundreds.
    assert waited == len(ids) - 1
    assert before == 1, before
    assert during <= 2, during
    assert {job(db_engine, i).status for i in ids} == {"succeeded"}
    assert site.count("/robots.txt") == 1


class _HostTurns:
    """A host's turns, each `wait_seconds` away: 0, at once; 3600, none within any
    attempt's wait (the host paused, or at its rate)."""

    def __init__(self, wait_seconds: float) -> None:
        self.wait_seconds = wait_seconds

    def take(self, host: str) -> float:
        return self.wait_seconds

    def release(self) -> None:
        return None


def test_a_hop_that_gets_no_turn_for_its_robots_txt_fetch_gives_its_lease_back(
    db_engine: Engine, make_tenant
) -> None:
    """A redirect hop's robots.txt is fetched on a turn of the hop's host: the slot takes the
    origin's lease, then waits for the turn. Given none within its wait (or stopped while
    waiting), it gave up holding the lease: every other worker's slot of that origin read
    "being fetched" and waited for nothing while the job stayed claimed, and for the whole
    lease (2 x the fetch timeout + 5 s) once the same worker claimed the job again."""
    from pin_orchestration.scraping.fetch.robots import RobotsGuard, RobotsPending

    tenant, _ = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, "http://127.0.0.1:9/page")
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET status = 'running', attempts = 1, lease_owner = 'w1',"
                " lease_expires_at = now() + interval '1 hour' WHERE id = :id"
            ),
            {"id": job_id},
        )
    claimed = leases.ClaimedJob(
        id=job_id,
        tenant_id=tenant.id,
        url="http://127.0.0.1:9/page",
        params={},
        attempt=1,
        budget_used=1,
        created_at=datetime.now(UTC),
        domain="127.0.0.1",
        priority="normal",
    )
    hop = "http://127.0.0.2:9/elsewhere"  # nothing is sent: the turn never comes
    guards = []
    with Fetcher(fetch_policy_from(TEST_SETTINGS)) as fetcher:
        for owner in ("w1", "w2"):
            guards.append(
                RobotsGuard(
                    db_engine,
                    fetcher,
                    mode="obey",
                    owner=owner,
                    domain_defaults=leases.DomainDefaults(1.0, 1),
                    retry_seconds=1.0,
                    max_pause_seconds=60.0,
                )
            )
        try:
            check = guards[0].hop_checker(claimed, _HostTurns(3600.0), lambda: False)
            with pytest.raises(RobotsPending, match="turn"):
                check(hop)
            with db_engine.connect() as conn:
                owner = conn.execute(
                    text("SELECT lease_owner FROM scraping.robots WHERE origin = :o"),
                    {"o": origin_of(hop)},
                ).scalar_one()
            assert owner is None
            # Another worker may fetch it at once.
            assert guards[1]._rows.take_lease(origin_of(hop), "127.0.0.2", uuid.uuid4()) == 0
        finally:
            for guard in guards:
                guard.close()


def _waiting_slots(
    db_engine: Engine, site: ScrapingTarget, fetcher: Fetcher, n: int, stop: threading.Event
) -> tuple[list[threading.Thread], list[BaseException | None]]:
    """`n` slots of one run asking for pages of `site`, whose robots.txt is held at the
    site: one fetches it, the others wait for it in the process. Each slot's end (None:
    allowed) goes into the list."""
    from pin_orchestration.scraping.fetch.robots import RobotsGuard

    guard = RobotsGuard(
        db_engine,
        fetcher,
        mode="obey",
        owner="w1",
        domain_defaults=leases.DomainDefaults(1000.0, 1000),
        retry_seconds=60.0,
        max_pause_seconds=600.0,
    )
    ends: list[BaseException | None] = [None] * n

    def slot(i: int) -> None:
        claimed = leases.ClaimedJob(
            id=uuid.uuid4(),
            tenant_id=uuid.uuid4(),
            url=f"{site.url}/page/{i}",
            params={},
            attempt=1,
            budget_used=1,
            created_at=datetime.now(UTC),
            domain="127.0.0.1",
            priority="normal",
        )
        try:
            guard.before_fetch(claimed, claimed.url, _HostTurns(0.0), stop.is_set)
        except BaseException as exc:  # noqa: BLE001  # the slot's end, examined by the test
            ends[i] = exc

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads, ends


@pytest.mark.parametrize("end", ["stop", "robots_txt_fails"])
def test_slots_waiting_for_a_held_robots_txt_end_on_a_stop_or_its_failure(
    db_engine: Engine, site: ScrapingTarget, end: str
) -> None:
    """50 slots of a run wait for the one fetching their origin's robots.txt, which the site
    holds. A stop ends them all, the fetching one too, long before any of their waits or
    the fetch's timeout (10 minutes) would, and leaves the origin's row unleased for the
    next run; a robots.txt that answers 503 ends them all unreachable, asked for once."""
    from pin_orchestration.scraping.fetch.errors import FetchError
    from pin_orchestration.scraping.fetch.robots import RobotsPending, RobotsUnreachable

    gate = threading.Event()
    site.robots = [(503, "down", {})]
    site.robots_gate = gate
    stop = threading.Event()
    policy = dataclasses.replace(TEST_SETTINGS, fetch_timeout_seconds=600.0)
    with Fetcher(fetch_policy_from(_with_allowed(policy, "127.0.0.1/32"))) as fetcher:
        threads, ends = _waiting_slots(db_engine, site, fetcher, 50, stop)
        try:
            bound = time.monotonic() + 120  # only a broken run gets here
            while site.count("/robots.txt") == 0:
                assert time.monotonic() < bound, "the robots.txt was never asked for"
                time.sleep(0.02)
            if end == "stop":
                stop.set()
            else:
                gate.set()
            for thread in threads:
                thread.join(timeout=max(bound - time.monotonic(), 0))
            assert not any(thread.is_alive() for thread in threads), "a slot outlived the end"
        finally:
            stop.set()
            gate.set()
            for thread in threads:
                thread.join()
    assert site.count("/robots.txt") == 1
    if end == "stop":
        assert all(isinstance(e, (RobotsPending, FetchError)) for e in ends), ends
        assert any(isinstance(e, FetchError) and e.error_class == "cancelled" for e in ends)
        with db_engine.connect() as conn:
            owner = conn.execute(
                text("SELECT lease_owner FROM scraping.robots WHERE origin = :o"),
                {"o": origin_of(site.url)},
            ).scalar_one()
        assert owner is None
    else:
        assert all(isinstance(e, RobotsUnreachable) for e in ends), ends
