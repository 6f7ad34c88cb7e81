"""Why a queued job waits (GET /jobs/{id}'s `wait`): each reason from a real state, and
what the claim then does agrees with it (docs/jobs/scraping.md, "Why is my job waiting")."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.cli import main as cli
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.fetch.robots_rules import origin_of
from pin_orchestration.scraping.store import leases, politeness, repository
from pin_orchestration.scraping.store.leases import AttemptOutcome, ClaimedJob
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.worker.run import claim_due_jobs
from tests.scraping.conftest import TEST_SETTINGS, UNLIMITED, Worker, auth


def submit(engine: Engine, tenant_id: uuid.UUID, url: str, priority: str = "normal") -> uuid.UUID:
    request = JobRequest(url=url, params={}, priority=priority)
    return repository.submit_job(engine, tenant_id, request, None).id


def robots_known(engine: Engine, url: str) -> None:
    """What a worker stores after the host's robots.txt answered 404: everything allowed,
    for a day."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.robots (origin, domain, state, http_status, fetched_at, "
                "expires_at) VALUES (:origin, :domain, 'allow_all', 404, now(), "
                "now() + interval '1 day')"
            ),
            {
                "origin": origin_of(url),
                "domain": politeness.normalize_host(urlsplit(url).hostname or ""),
            },
        )


def claim(engine: Engine, limit: int = 1, **limits: Any) -> list[ClaimedJob]:
    defaults = dataclasses.replace(UNLIMITED, **limits)
    return claim_due_jobs(
        engine, worker="probe", limit=limit, lease_seconds=60, domain_defaults=defaults
    )


def wait_of(client: TestClient, key: str, job_id: uuid.UUID) -> dict[str, Any]:
    answer = client.get(f"/jobs/{job_id}", headers=auth(key))
    assert answer.status_code == 200, answer.text
    wait = answer.json()["wait"]
    assert wait is not None and wait["message"]
    return wait


def moment(value: str) -> datetime:
    return datetime.fromisoformat(value)


def finish(engine: Engine, job: ClaimedJob, **outcome: Any) -> None:
    written = leases.finish_attempts(
        engine,
        worker="probe",
        outcomes=[AttemptOutcome(job_id=job.id, attempt=job.attempt, **outcome)],
    )
    assert job.id in written


def test_retry_backoff_until_the_next_attempt_and_not_claimed_before(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    tenant, key = make_tenant("shop")
    url = "http://127.0.0.2/a"
    robots_known(db_engine, url)
    job_id = submit(db_engine, tenant.id, url)
    [job] = claim(db_engine)
    retry_at = datetime.now(UTC) + timedelta(seconds=30)
    finish(
        db_engine,
        job,
        status="queued",
        outcome="retry",
        error_class="http_503",
        next_attempt_at=retry_at,
    )

    wait = wait_of(client, key, job_id)
    assert wait["reason"] == "retry_backoff"
    assert abs((moment(wait["until"]) - retry_at).total_seconds()) < 2
    assert claim(db_engine, limit=10) == []


def test_host_paused_by_an_operator_and_by_a_retry_after_is_not_claimed_before_its_end(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    tenant, key = make_tenant("shop")
    operator_url, target_url = "http://127.0.0.2/a", "http://127.0.0.3/a"
    for url in (operator_url, target_url):
        robots_known(db_engine, url)
    until = politeness.pause_domain(db_engine, "127.0.0.2", seconds=30, max_pause_seconds=3600)
    by_operator = submit(db_engine, tenant.id, operator_url)

    # a 429 with Retry-After on 127.0.0.3: its other job waits for the host
    submit(db_engine, tenant.id, target_url)
    [answered] = claim(db_engine)
    assert answered.domain == "127.0.0.3"
    waiting = submit(db_engine, tenant.id, target_url)
    paused_until = datetime.now(UTC) + timedelta(seconds=30)
    finish(
        db_engine,
        answered,
        status="queued",
        outcome="retry",
        http_status=429,
        error_class="http_429",
        next_attempt_at=paused_until,
        domain="127.0.0.3",
        domain_paused_until=paused_until,
    )

    operator_wait = wait_of(client, key, by_operator)
    assert (operator_wait["reason"], operator_wait["cause"]) == ("host_paused", "operator")
    assert moment(operator_wait["until"]) == until
    target_wait = wait_of(client, key, waiting)
    assert (target_wait["reason"], target_wait["cause"]) == ("host_paused", "retry_after")
    assert abs((moment(target_wait["until"]) - paused_until).total_seconds()) < 2
    assert claim(db_engine, limit=10) == []


def test_host_paused_while_its_robots_txt_is_unreachable(
    db_engine: Engine, make_tenant, client: TestClient, site: ScrapingTarget, work: Worker
) -> None:
    site.robots = [(503, "down", {})]
    tenant, key = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, f"{site.url}/page/x")

    work(settings=dataclasses.replace(TEST_SETTINGS, robots_retry_seconds=30))

    wait = wait_of(client, key, job_id)
    assert (wait["reason"], wait["cause"]) == ("host_paused", "robots_unreachable")
    assert moment(wait["until"]) > datetime.now(UTC) + timedelta(seconds=20)
    assert claim(db_engine, limit=10) == []
    assert site.requests == []
    # operators see it, with the next try
    shown = CliRunner().invoke(
        cli,
        ["scraping", "domain", "list"],
        env={"PIN_DATABASE_URL": db_engine.url.render_as_string(hide_password=False)},
    )
    assert f"{site.url}/robots.txt unreachable (1 failures in a row, last: HTTP 503)" in (
        shown.output
    ), shown.output


def test_host_rate_and_host_connections_hold_what_the_claim_holds(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    tenant, key = make_tenant("shop")
    slow, busy = "http://127.0.0.2/a", "http://127.0.0.3/a"
    for url in (slow, busy):
        robots_known(db_engine, url)
    politeness.set_domain_limits(db_engine, "127.0.0.2", rps=0.01, concurrency=None)
    politeness.set_domain_limits(db_engine, "127.0.0.3", rps=None, concurrency=1)
    for url in (slow, busy):
        submit(db_engine, tenant.id, url)
    assert len(claim(db_engine, limit=10)) == 2  # one token, one connection: spent
    rate_bound = submit(db_engine, tenant.id, slow)
    connection_bound = submit(db_engine, tenant.id, busy)

    rate = wait_of(client, key, rate_bound)
    assert rate["reason"] == "host_rate"
    # 0.01 rps: the next token in about 100 s
    assert moment(rate["until"]) > datetime.now(UTC) + timedelta(seconds=90)
    connections = wait_of(client, key, connection_bound)
    assert (connections["reason"], connections["until"]) == ("host_connections", None)
    assert claim(db_engine, limit=10) == []


def test_robots_pending_until_its_host_robots_txt_is_known(
    db_engine: Engine, make_tenant, client: TestClient, site: ScrapingTarget, work: Worker
) -> None:
    tenant, key = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, f"{site.url}/page/x")

    assert wait_of(client, key, job_id)["reason"] == "robots_pending"
    work()
    # the worker that took it asked for robots.txt first
    assert site.all_requests == ["/robots.txt", "/page/x"]


def test_tenant_turn_is_the_job_the_next_claims_skip_for_others(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    a, key_a = make_tenant("a")
    b, _ = make_tenant("b")
    url = "http://127.0.0.2/a"
    robots_known(db_engine, url)
    a_jobs = [submit(db_engine, a.id, url) for _ in range(3)]
    b_jobs = [submit(db_engine, b.id, url) for _ in range(3)]
    last_of_a = a_jobs[-1]

    wait = wait_of(client, key_a, last_of_a)
    assert wait["reason"] == "tenant_turn"
    assert wait["message"] == (
        "2 of this tenant's jobs on its host go first; 1 other tenant with jobs there takes "
        "turns with it."
    )
    # the next four claims take a's two ahead of it and, turn about with a, two of b's;
    # never it
    taken = [job.id for _ in range(4) for job in claim(db_engine)]
    assert last_of_a not in taken
    assert set(taken) == {*a_jobs[:2], *b_jobs[:2]}
    assert wait_of(client, key_a, last_of_a)["reason"] == "no_free_worker"
    assert [job.id for job in claim(db_engine)] == [last_of_a]


def test_class_share_gives_the_next_pick_to_the_class_named_then_no_free_worker(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    tenant, key = make_tenant("shop")
    high_url, low_url = "http://127.0.0.2/a", "http://127.0.0.3/a"
    for url in (high_url, low_url):
        robots_known(db_engine, url)
    high = submit(db_engine, tenant.id, high_url, priority="high")
    low = submit(db_engine, tenant.id, low_url, priority="low")

    wait = wait_of(client, key, low)
    assert wait["reason"] == "class_share" and "high" in wait["message"]
    assert [job.id for job in claim(db_engine)] == [high]
    assert wait_of(client, key, low)["reason"] == "no_free_worker"
    assert [job.id for job in claim(db_engine)] == [low]


def test_a_job_that_is_not_queued_has_no_wait_and_explain_shows_the_same(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    tenant, key = make_tenant("shop")
    url = "http://127.0.0.2/a"
    robots_known(db_engine, url)
    waiting = submit(db_engine, tenant.id, url)
    until = politeness.pause_domain(db_engine, "127.0.0.2", seconds=30, max_pause_seconds=3600)

    shown = CliRunner().invoke(
        cli,
        ["scraping", "job", "explain", str(waiting)],
        env={"PIN_DATABASE_URL": db_engine.url.render_as_string(hide_password=False)},
    )
    assert shown.exit_code == 0, shown.output
    assert f"waiting: host_paused (operator)\tuntil {until.isoformat()}" in shown.output
    politeness.resume_domain(db_engine, "127.0.0.2")
    [job] = claim(db_engine)
    answer = client.get(f"/jobs/{job.id}", headers=auth(key)).json()
    assert (answer["status"], answer["wait"]) == ("running", None)


def test_a_job_behind_others_waits_its_turn_not_its_hosts_robots_txt(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    """The claim does not look at robots.txt: a worker reads it after the claim. A job
    fourth in its host's line while the host's robots.txt was unknown was told
    robots_pending, while the next claims took the four ahead of it."""
    a, key_a = make_tenant("a")
    b, _ = make_tenant("b")
    url = "http://127.0.0.2/a"  # its robots.txt never fetched
    a_jobs = [submit(db_engine, a.id, url) for _ in range(3)]
    b_jobs = [submit(db_engine, b.id, url) for _ in range(3)]
    last_of_a = a_jobs[-1]

    assert wait_of(client, key_a, last_of_a)["reason"] == "tenant_turn"
    taken = [job.id for _ in range(4) for job in claim(db_engine)]
    assert set(taken) == {*a_jobs[:2], *b_jobs[:2]}
    # next in line: the robots.txt is what it waits for once a worker takes it
    assert wait_of(client, key_a, last_of_a)["reason"] == "robots_pending"
    assert [job.id for job in claim(db_engine)] == [last_of_a]


def test_a_job_handed_back_while_its_robots_txt_is_fetched_says_so(
    db_engine: Engine, make_tenant, client: TestClient
) -> None:
    """Handed back because another worker was still fetching its host's robots.txt, a job
    was told retry_backoff, "backoff after the last": no attempt of it had failed."""
    tenant, key = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, "http://127.0.0.2/a")
    [job] = claim(db_engine)
    again_at = datetime.now(UTC) + timedelta(seconds=30)
    finish(
        db_engine,
        job,
        status="queued",
        outcome="retry",
        error_class="robots_pending",
        next_attempt_at=again_at,
        robots_wait=True,
    )

    wait = wait_of(client, key, job_id)
    assert wait["reason"] == "robots_pending"
    assert abs((moment(wait["until"]) - again_at).total_seconds()) < 2
    assert claim(db_engine, limit=10) == []


def test_an_operator_pause_past_an_unreachable_robots_txt_is_the_operators(
    db_engine: Engine, make_tenant, client: TestClient, site: ScrapingTarget, work: Worker
) -> None:
    """robots.txt unreachable (next try in 30 s), then an operator pauses the host for ten
    minutes: the job waits for the operator, and was told robots_unreachable."""
    site.robots = [(503, "down", {})]
    tenant, key = make_tenant("shop")
    job_id = submit(db_engine, tenant.id, f"{site.url}/page/x")
    work(settings=dataclasses.replace(TEST_SETTINGS, robots_retry_seconds=30))
    assert wait_of(client, key, job_id)["cause"] == "robots_unreachable"

    until = politeness.pause_domain(db_engine, "127.0.0.1", seconds=600, max_pause_seconds=3600)

    wait = wait_of(client, key, job_id)
    assert (wait["reason"], wait["cause"]) == ("host_paused", "operator")
    assert moment(wait["until"]) == until


@pytest.mark.parametrize("a_has_the_smaller_id", [True, False])
def test_tenant_turn_counts_turns_by_tenant_not_other_tenants_earlier_fair_tags(
    db_engine: Engine, make_tenant, client: TestClient, a_has_the_smaller_id: bool
) -> None:
    """The claim takes turns by tenant (start tags), not by the jobs' fair tags. Tenant a's
    job on host h has a late fair tag (a has ten jobs on a paused host); b's five jobs on h
    have early ones. a's job was told "5 jobs with an earlier turn on its host go first, 5
    of them other tenants'", while the claim took it after at most one of b's. (The two
    tenants' turns tie at first, and the tie goes by tenant id: both ways are run.)"""
    first, second = sorted((make_tenant("x"), make_tenant("y")), key=lambda t: t[0].id)
    (a, key_a), (b, _) = (first, second) if a_has_the_smaller_id else (second, first)
    host, paused = "http://127.0.0.2/a", "http://127.0.0.3/a"
    for url in (host, paused):
        robots_known(db_engine, url)
    politeness.pause_domain(db_engine, "127.0.0.3", seconds=600, max_pause_seconds=3600)
    for _ in range(10):
        submit(db_engine, a.id, paused)
    b_jobs = [submit(db_engine, b.id, host) for _ in range(5)]
    a_job = submit(db_engine, a.id, host)

    wait = wait_of(client, key_a, a_job)
    # what the claim really does: b's jobs it takes before a's
    taken: list[uuid.UUID] = []
    while a_job not in taken:
        [job] = claim(db_engine)
        taken.append(job.id)
    before = len(taken) - 1
    assert set(taken[:-1]) <= set(b_jobs) and before <= 1
    if before == 0:
        assert wait["reason"] == "no_free_worker", wait
    else:
        assert wait["reason"] == "tenant_turn", wait
        assert wait["message"] == (
            "It is this tenant's next job on its host; 1 other tenant with jobs there has "
            "its turn first."
        ), wait
