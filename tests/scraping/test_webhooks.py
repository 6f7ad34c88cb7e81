"""Completion webhooks (SCR-11) against a real loopback receiver and real PostgreSQL:
signed as Standard Webhooks (every delivery a `receiver` gets is verified at teardown by
the `standardwebhooks` and `svix` libraries), delivered at least once through the DB,
retried with backoff up to the cap, recorded and readable at /jobs/{id}/deliveries, never
sent to a refused address."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.devstack.standins.hostile_peer import CORPUS as HOSTILE_CORPUS
from pin_orchestration.devstack.standins.hostile_peer import HostilePeer
from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.devstack.standins.webhook_receiver import Receiver
from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.policies import webhook_fetch_policy_from
from pin_orchestration.scraping.store.leases import requeue_failed_jobs
from pin_orchestration.scraping.store.repository import JobRequest, cancel_job, submit_job
from pin_orchestration.scraping.store.tenancy import Tenant
from pin_orchestration.scraping.webhooks.deliveries import (
    DeliveryReport,
    list_deliveries,
    run_deliveries,
    tenant_webhook_secret,
)
from pin_orchestration.scraping.webhooks.options import (
    DeliveryOptions,
    WebhookConfigError,
    WebhookPolicy,
)
from pin_orchestration.scraping.webhooks.signing import secret_key, signed_headers
from tests.scraping.conftest import TEST_SETTINGS, _with_allowed, auth
from tests.scraping.webhook_checks import assert_every_delivery_verifies, refusals, verifies


class _SkewedTime:
    """The `time` module as a host whose wall clock is `skew` seconds off sees it."""

    def __init__(self, skew: float) -> None:
        self.skew = skew
        self.monotonic = time.monotonic
        self.sleep = time.sleep

    def time(self) -> float:
        return time.time() + self.skew


# Tests make every retry due at once (webhook_next_attempt_at moved back) instead of
# waiting out the backoff: a controllable clock on the rows.
POLICY = WebhookPolicy(
    max_attempts=4, backoff_base_seconds=30, backoff_cap_seconds=60, timeout_seconds=2.5
)


@pytest.fixture
def receiver(db_engine: Engine) -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()
    assert_every_delivery_verifies(db_engine, r.received)


Deliver = Callable[..., DeliveryReport]


@pytest.fixture
def deliver(db_engine: Engine) -> Deliver:
    def run(
        *,
        allowed: str = "127.0.0.1/32",
        policy: WebhookPolicy = POLICY,
        user_agent: str = TEST_SETTINGS.user_agent,
    ) -> DeliveryReport:
        settings = dataclasses.replace(_with_allowed(TEST_SETTINGS, allowed), user_agent=user_agent)
        with Fetcher(webhook_fetch_policy_from(settings)) as fetcher:
            return run_deliveries(
                db_engine,
                fetcher,
                policy,
                DeliveryOptions(batch_size=10),
                rng=random.Random(3),
            )

    return run


def finished_job(engine: Engine, tenant: Tenant, callback_url: str | None) -> uuid.UUID:
    """A job with a callback, finished the way the API finishes one (queued → cancelled)."""
    request = JobRequest(url="http://127.0.0.1:9/x", params={}, callback_url=callback_url)
    job_id = submit_job(engine, tenant.id, request, None).id
    assert cancel_job(engine, tenant.id, job_id) == ("cancelled", True)
    return job_id


def make_retries_due(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.jobs SET webhook_next_attempt_at = now() - interval '1 second' "
                "WHERE finish_published_at IS NULL AND webhook_next_attempt_at IS NOT NULL"
            )
        )


def job_row(engine: Engine, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT status, finished_at, finish_published_at, webhook_attempts "
                "FROM scraping.jobs WHERE id = :id"
            ),
            {"id": job_id},
        ).one()


def test_a_finished_job_is_announced_once_signed_with_the_tenants_secret(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
) -> None:
    tenant, _ = make_tenant("acme")
    job_id = finished_job(db_engine, tenant, receiver.url())
    assert job_row(db_engine, job_id).finish_published_at is None

    report = deliver()

    assert (report.claimed, report.delivered) == (1, 1)
    [received] = receiver.received
    row = job_row(db_engine, job_id)
    assert json.loads(received.body) == {
        "id": str(job_id),
        "status": "cancelled",
        "finished_at": row.finished_at.isoformat(),
    }
    # The maintained libraries accept it with the secret `pin tenant webhook-secret` shows
    # (whsec_<base64>) — and not with another tenant's, nor with a changed body.
    secret = tenant_webhook_secret(db_engine, "acme")["webhook_secret"]
    assert secret.startswith("whsec_") and verifies(secret, received)
    assert len(secret_key(secret)) == 32  # whsec_ + base64 of 32 random bytes (0015)
    other = tenant_webhook_secret(db_engine, make_tenant("other")[0].name)["webhook_secret"]
    assert not verifies(other, received)
    changed = received.body.replace(b"cancelled", b"succeeded")
    assert refusals(secret, changed, received.headers) == ["standardwebhooks", "svix"]
    assert received.headers["webhook-id"].startswith("msg_")
    assert received.headers["Content-Type"] == "application/json"
    assert row.finish_published_at is not None

    # Acknowledged: never sent again, even once due times pass.
    make_retries_due(db_engine)
    assert deliver().claimed == 0
    assert len(receiver.received) == 1


def test_a_delivery_names_the_service_by_its_configured_user_agent(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
) -> None:
    # The receiver sees the operator's PIN_SCRAPING_USER_AGENT, as every target does.
    finished_job(db_engine, make_tenant("acme")[0], receiver.url())
    assert deliver(user_agent="acme-crawler/2.1 (+ops)").delivered == 1
    [received] = receiver.received
    assert received.headers["User-Agent"] == "acme-crawler/2.1 (+ops)"


def test_a_rotation_signs_with_both_secrets_for_the_overlap_then_with_the_new_one(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
) -> None:
    tenant, _ = make_tenant("acme")
    old = tenant_webhook_secret(db_engine, "acme")["webhook_secret"]
    new = tenant_webhook_secret(db_engine, "acme", rotate=True)["webhook_secret"]
    assert new != old and new.startswith("whsec_")
    finished_job(db_engine, tenant, receiver.url())
    deliver()
    [during] = receiver.received
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert verifies(new, during) and verifies(old, during)

    # The overlap (POLICY: the default day) is over: the old secret is rotated out.
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE scraping.tenants SET webhook_secret_rotated_at = now() - "
                "make_interval(secs => :overlap + 1) WHERE id = :id"
            ),
            {"overlap": POLICY.secret_overlap_seconds, "id": tenant.id},
        )
    finished_job(db_engine, tenant, receiver.url())
    deliver()
    after = receiver.received[1]
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    assert verifies(new, after)
    assert refusals(old, after.body, after.headers) == ["standardwebhooks", "svix"]


def test_no_overlap_signs_with_the_new_secret_only(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
) -> None:
    tenant, _ = make_tenant("acme")
    old = tenant_webhook_secret(db_engine, "acme")["webhook_secret"]
    new = tenant_webhook_secret(db_engine, "acme", rotate=True)["webhook_secret"]
    finished_job(db_engine, tenant, receiver.url())
    deliver(policy=dataclasses.replace(POLICY, secret_overlap_seconds=0))
    [received] = receiver.received
    assert verifies(new, received) and not verifies(old, received)


def test_a_delivery_signed_too_long_ago_is_refused_by_the_libraries(
    db_engine: Engine, make_tenant: Callable[[str], tuple[Tenant, str]]
) -> None:
    """A delivery captured and replayed later: its signed timestamp is 10 minutes old."""
    make_tenant("acme")
    secret = tenant_webhook_secret(db_engine, "acme")["webhook_secret"]
    body = b'{"id":"x","status":"succeeded","finished_at":"2026-01-01T00:00:00+00:00"}'
    headers = signed_headers((secret,), "msg_x", body, now=time.time() - 600)
    assert refusals(secret, body, headers) == ["standardwebhooks", "svix"]
    fresh = signed_headers((secret,), "msg_x", body, now=time.time())
    assert refusals(secret, body, fresh) == []


def test_a_delivery_is_signed_by_the_database_clock_not_the_hosts(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The delivery loop's host clock 10 minutes behind (or ahead): its deliveries are
    still signed with the time the database reads, the clock every other decision of the
    service is made by, so the receiver's libraries accept them. (Signed with the host's
    clock, every delivery from a skewed host was refused.)"""
    from pin_orchestration.scraping.webhooks import deliveries as webhooks

    tenant, _ = make_tenant("acme")
    finished_job(db_engine, tenant, receiver.url())
    monkeypatch.setattr(webhooks, "time", _SkewedTime(-600))
    settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
    with Fetcher(webhook_fetch_policy_from(settings)) as fetcher:
        report = run_deliveries(db_engine, fetcher, POLICY, DeliveryOptions(batch_size=10))
    assert report.delivered == 1
    [received] = receiver.received
    with db_engine.connect() as conn:
        db_now = conn.execute(text("SELECT extract(epoch FROM now())")).scalar_one()
    assert abs(int(received.headers["webhook-timestamp"]) - float(db_now)) < 30
    # (the fixture's teardown verifies it with both libraries)


@pytest.mark.parametrize(
    "retry_after,at_least",
    [("45", 44), ("0", 0), ("Sun, 06 Nov 1994 08:49:37 GMT", 0), ("99999", 59)],
)
def test_a_receivers_retry_after_holds_its_retry_back_as_a_targets_does(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
    retry_after: str,
    at_least: float,
) -> None:
    """One rule for Retry-After, the job's and the webhook's: a retry is never earlier
    than its backoff nor than the Retry-After (capped, here by backoff_cap_seconds = 60);
    one asking for no wait (0, a past date) is as if absent. The receiver's was ignored."""
    tenant, _ = make_tenant("acme")
    receiver.status, receiver.headers = 429, {"Retry-After": retry_after}
    finished_job(db_engine, tenant, receiver.url())
    report = deliver()
    assert (report.claimed, report.retried) == (1, 1)
    with db_engine.connect() as conn:
        [delay] = conn.execute(
            text(
                "SELECT extract(epoch FROM next_attempt_at - now())"
                " FROM scraping.webhook_deliveries"
            )
        ).scalars()
    assert at_least <= float(delay) <= POLICY.backoff_cap_seconds


def test_a_receiver_down_for_a_while_gets_every_event_once_back(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    deliver: Deliver,
) -> None:
    tenant, _ = make_tenant("acme")
    down = Receiver()
    port = down.port
    down.close()  # nothing listens on the port: connections are refused
    url = f"http://127.0.0.1:{port}/hook"
    jobs = {finished_job(db_engine, tenant, url) for _ in range(5)}

    for _ in range(2):
        report = deliver()
        assert (report.claimed, report.retried, report.delivered) == (5, 5, 0)
        assert report.by_error_class == {"connection_error": 5}
        # Backed off: nothing is due again before its jittered delay.
        assert deliver().claimed == 0
        make_retries_due(db_engine)

    back = Receiver(port)
    try:
        report = deliver()
        assert (report.claimed, report.delivered) == (5, 5)
        make_retries_due(db_engine)
        assert deliver().claimed == 0
        assert {uuid.UUID(e["id"]) for e in back.events()} == jobs
        assert len(back.received) == 5
    finally:
        back.close()
    for job_id in jobs:
        assert job_row(db_engine, job_id).webhook_attempts == 3


def test_retries_stop_at_the_cap_and_the_failure_is_visible_at_deliveries(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
    client: TestClient,
) -> None:
    tenant, key = make_tenant("acme")
    receiver.status = 500
    job_id = finished_job(db_engine, tenant, receiver.url())
    for _ in range(POLICY.max_attempts + 2):
        deliver()
        make_retries_due(db_engine)

    assert len(receiver.received) == POLICY.max_attempts
    # One event: every retry carries its id (the receiver's de-duplication key).
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1
    assert job_row(db_engine, job_id).finish_published_at is not None

    answer = client.get(f"/jobs/{job_id}/deliveries", headers=auth(key))
    assert answer.status_code == 200
    items = answer.json()["items"]
    assert [(i["number"], i["outcome"], i["http_status"]) for i in items] == [
        (1, "retry", 500),
        (2, "retry", 500),
        (3, "retry", 500),
        (4, "gave_up", 500),
    ]
    assert all(i["error_class"] == "http_500" for i in items)
    assert all(i["next_attempt_at"] is not None for i in items[:3])
    assert items[3]["next_attempt_at"] is None and items[0]["job_status"] == "cancelled"

    # Another tenant's job is 404, and so is an unknown one.
    _, other_key = make_tenant("other")
    assert client.get(f"/jobs/{job_id}/deliveries", headers=auth(other_key)).status_code == 404
    assert client.get(f"/jobs/{uuid.uuid4()}/deliveries", headers=auth(key)).status_code == 404


def test_backoff_grows_with_jitter_within_the_cap(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
) -> None:
    tenant, _ = make_tenant("acme")
    receiver.status = 503
    for _ in range(6):
        finished_job(db_engine, tenant, receiver.url())
    deliver()
    with db_engine.connect() as conn:
        delays = (
            conn.execute(
                text(
                    "SELECT EXTRACT(EPOCH FROM next_attempt_at - attempted_at) "
                    "FROM scraping.webhook_deliveries"
                )
            )
            .scalars()
            .all()
        )
    # Attempt 1: full jitter over [0, base]; not all alike.
    assert len(delays) == 6
    assert all(-1 <= float(d) <= POLICY.backoff_base_seconds for d in delays)
    assert len({round(float(d), 3) for d in delays}) > 1


def test_a_callback_to_a_refused_address_is_never_contacted(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    deliver: Deliver,
    client: TestClient,
) -> None:
    tenant, key = make_tenant("acme")
    with ScrapingTarget(host="127.0.0.2") as forbidden:
        job_id = finished_job(db_engine, tenant, f"{forbidden.url}/hook")
        report = deliver(allowed="127.0.0.1/32")
        make_retries_due(db_engine)
        deliver(allowed="127.0.0.1/32")
        assert forbidden.accepted_connections == 0
    assert (report.claimed, report.gave_up) == (1, 1)
    [item] = client.get(f"/jobs/{job_id}/deliveries", headers=auth(key)).json()["items"]
    assert (item["outcome"], item["error_class"]) == ("gave_up", "refused_address")


def test_a_job_finished_by_a_worker_is_announced_and_one_without_callback_is_not(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
    site: Any,
    work: Any,
) -> None:
    tenant, _ = make_tenant("acme")
    with_callback = submit_job(
        db_engine,
        tenant.id,
        JobRequest(url=f"{site.url}/page/a", params={}, callback_url=receiver.url()),
        None,
    ).id
    submit_job(db_engine, tenant.id, JobRequest(url=f"{site.url}/page/b", params={}), None)
    finished_job(db_engine, tenant, None)
    work()
    assert job_row(db_engine, with_callback).status == "succeeded"
    report = deliver()
    assert report.claimed == 1
    assert receiver.events() == [
        {
            "id": str(with_callback),
            "status": "succeeded",
            "finished_at": job_row(db_engine, with_callback).finished_at.isoformat(),
        }
    ]


def test_a_requeued_job_announces_its_next_finish(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
) -> None:
    tenant, _ = make_tenant("acme")
    job_id = finished_job(db_engine, tenant, receiver.url())
    with db_engine.begin() as conn:
        conn.execute(
            text("UPDATE scraping.jobs SET status = 'failed' WHERE id = :id"), {"id": job_id}
        )
    deliver()
    assert requeue_failed_jobs(db_engine, [job_id]) == [job_id]
    assert deliver().claimed == 0  # queued again: nothing owed
    assert cancel_job(db_engine, tenant.id, job_id) == ("cancelled", True)
    deliver()
    assert [e["status"] for e in receiver.events()] == ["failed", "cancelled"]
    # Two finishes are two events: two ids.
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 2


def test_openapi_documents_the_webhook_as_a_callback_and_the_deliveries_route(
    client: TestClient,
) -> None:
    spec = client.get("/openapi.json").json()
    callbacks = spec["paths"]["/jobs"]["post"]["callbacks"]
    [(_, expression)] = [(name, c) for name, c in callbacks.items()]
    operation = expression["{$request.body#/callback_url}"]["post"]
    headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
    assert headers == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    body_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    event = spec["components"]["schemas"][body_ref.rsplit("/", 1)[1]]
    assert set(event["properties"]) == {"id", "status", "finished_at"}
    assert "404" in spec["paths"]["/jobs/{job_id}/deliveries"]["get"]["responses"]
    assert "410" in spec["paths"]["/jobs/{job_id}/result"]["get"]["responses"]


def test_pin_shows_and_rotates_the_secret_and_delivers_from_the_shell(
    db_engine: Engine,
    db_url: str,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.test_cli import pin

    tenant, _ = make_tenant("acme")
    shown = pin("tenant", "webhook-secret", "acme", "--json", url=db_url, home=tmp_path)
    assert shown.returncode == 0, shown.stderr
    secret = json.loads(shown.stdout)["webhook_secret"]
    assert secret == tenant_webhook_secret(db_engine, "acme")["webhook_secret"]
    rotated = pin("tenant", "webhook-secret", "acme", "--rotate", url=db_url, home=tmp_path)
    assert rotated.returncode == 0, rotated.stderr
    new = tenant_webhook_secret(db_engine, "acme")["webhook_secret"]
    assert new != secret and new in rotated.stdout
    unknown = pin("tenant", "webhook-secret", "nobody", url=db_url, home=tmp_path)
    assert unknown.returncode != 0 and "no tenant 'nobody'" in unknown.stderr

    finished_job(db_engine, tenant, receiver.url())
    monkeypatch.setenv("PIN_SCRAPING_ALLOWED_CIDRS", "127.0.0.1/32")  # pin inherits it
    delivered = pin("scraping", "deliver", "--batch-size", "5", url=db_url, home=tmp_path)
    assert delivered.returncode == 0, delivered.stderr
    assert json.loads(delivered.stdout.strip().splitlines()[-1])["delivered"] == 1
    assert len(receiver.received) == 1


def test_two_delivery_loops_at_once_send_each_event_once(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
) -> None:
    tenant, _ = make_tenant("acme")
    jobs = {finished_job(db_engine, tenant, receiver.url()) for _ in range(60)}
    settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
    reports: list[DeliveryReport] = []
    start = threading.Barrier(2)

    def loop() -> None:
        with Fetcher(webhook_fetch_policy_from(settings)) as fetcher:
            start.wait()
            reports.append(
                run_deliveries(
                    db_engine, fetcher, POLICY, DeliveryOptions(batch_size=5, concurrency=4)
                )
            )

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [uuid.UUID(e["id"]) for e in receiver.events()]
    assert sorted(ids) == sorted(jobs)  # every event, none twice
    assert sum(r.delivered for r in reports) == 60


class HangingReceiver:
    """A loopback receiver that holds every POST until released (a tenant's receiver that
    hangs), counting the calls it holds."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.release = threading.Event()
        self.held = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    outer.held += 1
                outer.release.wait(120)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.parametrize("concurrency,per_tenant", [(4, 2), (2, 2), (4, 4)])
def test_a_tenant_whose_receiver_hangs_holds_only_its_share_of_the_slots(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    concurrency: int,
    per_tenant: int,
) -> None:
    """Ten deliveries of a tenant whose receiver hangs fall due first, then three of
    another tenant: those three arrive while the ten are still held (not after the hang
    ends), and no delivery is claimed before a slot can send it — so its lease, sized to
    one call, cannot run out while it waits behind others. With per_tenant == concurrency
    the hanging tenant took every slot (the other's first delivery went out, the rest
    waited for the hanging calls' timeouts): a tenant's share is one slot short of all."""
    hanging = HangingReceiver()
    try:
        slow, _ = make_tenant("slow")
        quick, _ = make_tenant("quick")
        for _ in range(10):
            finished_job(db_engine, slow, hanging.url())
        with db_engine.begin() as conn:  # the slow tenant's deliveries are due first
            conn.execute(text("UPDATE scraping.jobs SET finished_at = now() - interval '1 min'"))
        quick_jobs = {finished_job(db_engine, quick, receiver.url()) for _ in range(3)}
        settings = dataclasses.replace(
            _with_allowed(TEST_SETTINGS, "127.0.0.1/32"), webhook_timeout_seconds=60
        )
        policy = WebhookPolicy(max_attempts=4, timeout_seconds=60)
        reports: list[DeliveryReport] = []

        def loop() -> None:
            with Fetcher(webhook_fetch_policy_from(settings)) as fetcher:
                reports.append(
                    run_deliveries(
                        db_engine,
                        fetcher,
                        policy,
                        DeliveryOptions(
                            batch_size=50, concurrency=concurrency, per_tenant=per_tenant
                        ),
                    )
                )

        thread = threading.Thread(target=loop)
        thread.start()
        try:
            deadline = time.monotonic() + 120  # a bound for a broken run only
            while len(receiver.events()) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert {uuid.UUID(e["id"]) for e in receiver.events()} == quick_jobs
            assert not hanging.release.is_set()
            with db_engine.connect() as conn:
                claimed = conn.execute(
                    text(
                        "SELECT count(*) FROM scraping.jobs WHERE finish_published_at IS NULL "
                        "AND webhook_attempts > 0"
                    )
                ).scalar_one()
            assert claimed <= concurrency  # claimed only as slots free up
        finally:
            hanging.release.set()
            thread.join(timeout=60)
        assert reports[0].delivered == 13
    finally:
        hanging.close()


def test_a_tenants_share_is_below_the_slots_unless_there_is_one() -> None:
    assert DeliveryOptions(concurrency=8, per_tenant=4).tenant_share == 4
    assert DeliveryOptions(concurrency=4, per_tenant=4).tenant_share == 3
    assert DeliveryOptions(concurrency=1, per_tenant=1).tenant_share == 1
    with pytest.raises(WebhookConfigError, match="per_tenant must be <= concurrency"):
        DeliveryOptions(concurrency=4, per_tenant=5).validate()


def deliveries_of(engine: Engine, job_id: uuid.UUID) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [(d["outcome"], d["error_class"]) for d in list_deliveries(conn, job_id)]


@pytest.mark.parametrize(
    "behaviour",
    [
        # Content-Length: ² (a digit to str.isdigit, not to int()) made the whole run raise
        # before anything was recorded: the other tenant's webhooks were sent and sent
        # again every run, and the bad ones were never given up. Its 200 is no
        # acknowledgement either: an answer without framing (RFC 9112 §6.3).
        "content-length-superscript",
        "content-length-negative",
        # A status line of raw bytes: its NUL went into error_detail, which PostgreSQL
        # refuses, so the attempt was never recorded and the webhook sent forever.
        "binary-garbage",
        "redirect-bad-location",
        "status-not-http",
    ],
)
def test_one_tenants_malformed_receiver_does_not_hold_up_the_other_tenants_webhooks(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
    behaviour: str,
) -> None:
    """Each delivery's outcome is its own, recorded: a receiver answering malformed HTTP
    gets its attempts, with backoff, up to the cap, then given up; the other tenant's
    webhooks arrive once each."""
    bad, _ = make_tenant("bad")
    good, _ = make_tenant("good")
    with HostilePeer() as peer:
        bad_jobs = [finished_job(db_engine, bad, peer.url(behaviour, f"j{i}")) for i in range(2)]
        good_jobs = {finished_job(db_engine, good, receiver.url()) for _ in range(3)}
        for _ in range(POLICY.max_attempts):
            deliver()
            make_retries_due(db_engine)
        deliver()  # nothing left: every delivery was closed
        posts = Counter(r.name for r in peer.seen())

    assert sorted(uuid.UUID(e["id"]) for e in receiver.events()) == sorted(good_jobs)
    for job_id in good_jobs:
        assert job_row(db_engine, job_id).finish_published_at is not None
        assert deliveries_of(db_engine, job_id) == [("delivered", None)]
    for name, job_id in zip(("j0", "j1"), bad_jobs, strict=True):
        assert job_row(db_engine, job_id).finish_published_at is not None
        outcomes = deliveries_of(db_engine, job_id)
        # Every POST the peer read is a recorded attempt, none past the cap. An attempt may
        # also fail before the peer reads it (a pooled connection the peer had closed after
        # its malformed answer: connection_error), never the other way round.
        assert posts[name] <= len(outcomes) <= POLICY.max_attempts
        assert [o for o, _ in outcomes] == ["retry"] * (POLICY.max_attempts - 1) + ["gave_up"]
        assert all(error_class is not None for _, error_class in outcomes)


class _FailsForOneHost(Fetcher):
    """A fetcher with a bug that shows for one callback only: whatever escapes a delivery
    must be that delivery's outcome, never the run's."""

    def __init__(self, policy: Any, failing_url: str) -> None:
        super().__init__(policy)
        self.failing_url = failing_url

    def post(self, url: str, body: bytes, headers: Any = None) -> Any:
        if url == self.failing_url:
            raise RuntimeError("a bug in the delivery path")
        return super().post(url, body, headers)


def test_an_unexpected_error_is_that_deliverys_failed_attempt_with_backoff_to_the_cap(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
) -> None:
    failing_url = receiver.url("/broken")
    tenant, _ = make_tenant("acme")
    broken = finished_job(db_engine, tenant, failing_url)
    fine = {finished_job(db_engine, tenant, receiver.url()) for _ in range(3)}
    settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
    reports = []
    with _FailsForOneHost(webhook_fetch_policy_from(settings), failing_url) as fetcher:
        for _ in range(POLICY.max_attempts):
            reports.append(
                run_deliveries(db_engine, fetcher, POLICY, DeliveryOptions(batch_size=10))
            )
            # Backed off: the failed delivery is not due again at once.
            assert job_row(db_engine, broken).finish_published_at is not None or (
                run_deliveries(db_engine, fetcher, POLICY).claimed == 0
            )
            make_retries_due(db_engine)

    assert sorted(uuid.UUID(e["id"]) for e in receiver.events()) == sorted(fine)
    assert deliveries_of(db_engine, broken) == [("retry", "delivery_error")] * (
        POLICY.max_attempts - 1
    ) + [("gave_up", "delivery_error")]
    assert reports[0].by_error_class == {"delivery_error": 1}
    assert reports[0].delivered == 3 and reports[-1].gave_up == 1


class GatedReceiver:
    """A loopback receiver that answers each POST with the next of `answers` (a status;
    0 holds the POST until `release` is set, then answers 204), recording the bodies."""

    def __init__(self, answers: list[int]) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.release = threading.Event()
        self.holding = threading.Event()
        self.bodies: list[bytes] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    status = answers[min(len(outer.bodies), len(answers) - 1)]
                    outer.bodies.append(body)
                if status == 0:
                    outer.holding.set()
                    outer.release.wait(120)
                    status = 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


def test_a_late_acknowledgement_of_an_old_finish_does_not_close_the_next_finishs_webhook(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    deliver: Deliver,
) -> None:
    """The job fails; its webhook is in flight (the receiver holds it) when an operator
    requeues the job and it fails again. The new finish's first delivery gets a 500. Then
    the old delivery is acknowledged: that 204 announced the old finish, so the new one
    must still be owed (matched by attempt number and status alone, it was closed)."""
    hooks = GatedReceiver([0, 500, 204])
    try:
        tenant, _ = make_tenant("acme")
        job_id = finished_job(db_engine, tenant, hooks.url())
        fail = text(
            "UPDATE scraping.jobs SET status = 'failed', finished_at = clock_timestamp() "
            "WHERE id = :id"
        )
        with db_engine.begin() as conn:
            conn.execute(fail, {"id": job_id})
        old = threading.Thread(target=deliver)
        old.start()
        assert hooks.holding.wait(120)  # the old finish's delivery is in flight
        assert requeue_failed_jobs(db_engine, [job_id]) == [job_id]
        with db_engine.begin() as conn:
            conn.execute(fail, {"id": job_id})
        report = deliver()  # the new finish's first delivery: 500, retried later
        assert (report.claimed, report.retried) == (1, 1)
        hooks.release.set()
        old.join(60)

        row = job_row(db_engine, job_id)
        assert row.finish_published_at is None, "the old finish's 204 closed the new finish"
        announced = [json.loads(b)["finished_at"] for b in hooks.bodies]
        assert announced[1] == row.finished_at.isoformat() != announced[0]
        make_retries_due(db_engine)
        assert deliver().delivered == 1  # the new finish, acknowledged itself
        assert job_row(db_engine, job_id).finish_published_at is not None
        assert json.loads(hooks.bodies[2])["finished_at"] == row.finished_at.isoformat()
    finally:
        hooks.close()


# The corpus' behaviours that answer at once (no drip past the timeout): a few seconds per
# generated history.
QUICK_HOSTILE = sorted(b for b in HOSTILE_CORPUS if not b.startswith("drip-"))


def test_generated_mixes_of_hostile_receivers_keep_every_tenants_promises(
    db_engine: Engine,
    make_tenant: Callable[[str], tuple[Tenant, str]],
    receiver: Receiver,
    deliver: Deliver,
) -> None:
    """Histories drawn by Hypothesis (derandomized, bounded): one tenant's receivers play
    a mix of the hostile corpus while another's are well behaved, over as many runs as
    the budget allows. Each hostile delivery is closed within the cap with every POST the
    peer read recorded as one attempt (retries before, a close last); each well-behaved
    webhook arrives once, delivered at its first attempt."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    with HostilePeer() as peer:

        @settings(
            max_examples=8,
            derandomize=True,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(
            behaviours=st.lists(st.sampled_from(QUICK_HOSTILE), min_size=1, max_size=4),
            good_count=st.integers(min_value=1, max_value=3),
        )
        def history(behaviours: list[str], good_count: int) -> None:
            tag = uuid.uuid4().hex[:8]
            bad, _ = make_tenant(f"bad-{tag}")
            good, _ = make_tenant(f"good-{tag}")
            bad_jobs = {
                finished_job(db_engine, bad, peer.url(b, f"{tag}-{i}")): f"{tag}-{i}"
                for i, b in enumerate(behaviours)
            }
            good_jobs = {finished_job(db_engine, good, receiver.url()) for _ in range(good_count)}
            for _ in range(POLICY.max_attempts + 1):
                deliver()
                make_retries_due(db_engine)
            posts = Counter(r.name for r in peer.seen())
            for job_id, name in bad_jobs.items():
                outcomes = [o for o, _ in deliveries_of(db_engine, job_id)]
                assert job_row(db_engine, job_id).finish_published_at is not None, outcomes
                assert len(outcomes) == posts[name] <= POLICY.max_attempts, (name, outcomes)
                assert outcomes[:-1] == ["retry"] * (len(outcomes) - 1), (name, outcomes)
                assert outcomes[-1] in ("delivered", "gave_up"), (name, outcomes)
                assert outcomes[-1] == "delivered" or len(outcomes) == POLICY.max_attempts
            arrived = Counter(uuid.UUID(e["id"]) for e in receiver.events())
            for job_id in good_jobs:
                assert arrived[job_id] == 1
                assert deliveries_of(db_engine, job_id) == [("delivered", None)]

        history()
