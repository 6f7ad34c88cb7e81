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
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from sqlalchemy import Engine, event, text

from pin_orchestration.cli import main as cli
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.platform.metrics import build_registry
from pin_orchestration.scraping import repository
from pin_orchestration.scraping.repository import JobRequest
from pin_orchestration.scraping.robots import (
    MAX_TTL_SECONDS,
    MIN_TTL_SECONDS,
    origin_of,
    ttl_seconds,
)
from tests.scraping.conftest import TEST_SETTINGS, Worker
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
    got = samples(generate_latest(build_registry(db_engine)).decode())
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
        deadline = time.monotonic() + 60
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
            assert w.wait(timeout=60) == 0, w.stderr.read().decode()
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
    [host] = [d for d in repository.list_domains(db_engine) if d["domain"] == "127.0.0.1"]
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
    [host] = [d for d in repository.list_domains(db_engine) if d["domain"] == "127.0.0.1"]
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


def test_an_origin_is_scheme_host_and_port() -> None:
    assert origin_of("http://Example.COM/a?b") == "http://example.com:80"
    assert origin_of("https://example.com:8443/") == "https://example.com:8443"
    assert origin_of("http://[::1]:81/x") == "http://[::1]:81"


def test_slots_waiting_for_their_origins_robots_txt_share_one_read_of_its_row(
    db_engine: Engine, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    """While robots.txt is being fetched, the run's other slots of that origin wait for the
    answer in the process, not each polling the database (556 slots read the row ~6,000
    times in the 2 s a robots.txt took, bench/scraping_workers.py), and slots that want
    the row at once take one read's answer."""
    gate = threading.Event()
    site.robots = [(200, "User-agent: *\nAllow: /\n", {})]
    site.robots_gate = gate
    tenant, _ = make_tenant("shop")
    ids = [submit(db_engine, tenant.id, f"{site.url}/page/{n}") for n in range(16)]
    reads = 0

    @event.listens_for(db_engine, "before_cursor_execute")
    def count(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        nonlocal reads
        if "d.robots_mode FROM scraping.domains" in statement:
            reads += 1

    run = threading.Thread(
        target=work, kwargs={"settings": dataclasses.replace(TEST_SETTINGS, slots=16)}
    )
    run.start()
    try:
        deadline = time.monotonic() + 30
        while True:  # every job claimed, one slot holding the robots.txt request
            with db_engine.connect() as conn:
                running = conn.execute(
                    text("SELECT count(*) FROM scraping.jobs WHERE status = 'running'")
                ).scalar()
            if running == 16 and site.count("/robots.txt") == 1:
                break
            assert time.monotonic() < deadline, "the jobs were never all claimed"
            time.sleep(0.02)
        before = reads
        time.sleep(0.5)  # ten of the waiting slots' polls each, were they polling
        during = reads - before
    finally:
        gate.set()
        run.join()
        event.remove(db_engine, "before_cursor_execute", count)
    # The 16 slots started at once: one read of the row between them, not one each.
    assert before <= 3, before
    assert during <= 2, during
    assert {job(db_engine, i).status for i in ids} == {"succeeded"}
    assert site.count("/robots.txt") == 1
