"""Issue 30: one way in. Every door a job enters by (POST /jobs, POST /jobs/batch, SQL's
scraping.submit_job, the Python helper) refuses the same URLs as a 422 (22023 in SQL)
naming the field, and keys an accepted job's domain as the fetcher resolves its host."""

from __future__ import annotations

import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from pin_orchestration.scraping.fetch.client import Fetcher, FetchPolicy
from pin_orchestration.scraping.fetch.errors import FetchError
from pin_orchestration.scraping.store import repository
from pin_orchestration.scraping.store.repository import JobRequest
from tests.scraping.conftest import auth
from tests.scraping.test_scheduling import claim


def fetched_host_key(url: str) -> str:
    """The key the worker pauses after a fetch of `url`: the host of the URL requests
    sends (its prepared URL), as scraping.pause_domains keys it."""
    prepared = requests.Request("GET", url).prepare().url
    host = urlsplit(prepared).hostname
    assert host is not None
    return host.rstrip(".")


def job_domain(engine: Engine, job_id: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT domain FROM scraping.jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()


def sql_submit(engine: Engine, tenant_id: uuid.UUID, url: str, **kw: Any) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text("SELECT scraping.submit_job(:tenant_id, :url, p_callback_url => :callback_url)"),
            {"tenant_id": tenant_id, "url": url, "callback_url": kw.get("callback_url")},
        ).scalar_one()


@pytest.mark.parametrize(
    "body",
    [
        {"url": "\u0001http://example.com/a"},
        {"url": "http://example.com:000080/a"},
        {"url": "http://example.com/a", "callback_url": "http://example.com:000080/hook"},
        {"url": "http://example.com/a", "callback_url": "\u001fhttp://example.com/hook"},
    ],
)
def test_urls_the_sql_check_refused_are_a_422_at_every_api_door(
    client: TestClient, make_tenant, body: dict[str, str]
) -> None:
    _, key = make_tenant("shop")
    field = "callback_url" if "callback_url" in body else "url"
    single = client.post("/jobs", json=body, headers=auth(key))
    assert single.status_code == 422, single.text
    assert single.json()["errors"][0]["pointer"] == f"/{field}"

    batch = client.post(
        "/jobs/batch",
        json={"jobs": [{"url": "http://example.com/ok"}, body]},
        headers=auth(key),
    )
    assert batch.status_code == 202, batch.text
    items = batch.json()["items"]
    assert [i["status"] for i in items] == [202, 422]
    assert items[1]["problem"]["errors"][0]["pointer"] == f"/jobs/1/{field}"


def test_a_key_with_nul_refuses_that_job_alone(client: TestClient, make_tenant) -> None:
    _, key = make_tenant("shop")
    answer = client.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"url": "http://example.com/1", "idempotency_key": "fine"},
                {"url": "http://example.com/2", "idempotency_key": "bad\u0000key"},
            ]
        },
        headers=auth(key),
    )
    assert answer.status_code == 202, answer.text
    items = answer.json()["items"]
    assert [i["status"] for i in items] == [202, 422]
    assert items[1]["problem"]["errors"][0]["pointer"] == "/jobs/1/idempotency_key"


def test_credentials_are_refused_by_sql_too(db_engine: Engine, make_tenant) -> None:
    tenant, _ = make_tenant("shop")
    for url, callback in [
        ("http://user:secret@example.com/a", None),
        ("http://example.com/a", "http://user:secret@example.com/hook"),
        ("http://user@example.com/a", None),
    ]:
        with pytest.raises(DBAPIError) as refused:
            sql_submit(db_engine, tenant.id, url, callback_url=callback)
        assert refused.value.orig.sqlstate == "22023"  # type: ignore[union-attr]
        assert "credentials" in str(refused.value.orig)
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one() == 0


def test_sql_refuses_a_non_ascii_host_naming_the_argument_and_the_xn_form(
    db_engine: Engine, make_tenant
) -> None:
    """The documented contract of scraping.submit_job (docs/integration.md): a host with
    non-ASCII characters is refused, the error naming the argument and the fix (its
    xn-- form, which is accepted and keyed as POST /jobs keys the Unicode one)."""
    tenant, _ = make_tenant("shop")
    for url, callback, argument in [
        ("http://bücher.example/a", None, "p_url"),
        ("http://example.com/a", "http://bücher.example/hook", "p_callback_url"),
    ]:
        with pytest.raises(DBAPIError) as refused:
            sql_submit(db_engine, tenant.id, url, callback_url=callback)
        message = str(refused.value.orig)
        assert refused.value.orig.sqlstate == "22023"  # type: ignore[union-attr]
        assert message.startswith(f"{argument} has a host with non-ASCII characters"), message
        assert "xn--" in message and "idna.encode" in message
    job_id = sql_submit(db_engine, tenant.id, "http://xn--bcher-kva.example/a")
    with db_engine.connect() as conn:
        domain = conn.execute(
            text("SELECT domain FROM scraping.jobs WHERE id = :id"), {"id": job_id}
        ).scalar_one()
    assert domain == "xn--bcher-kva.example"


@pytest.mark.parametrize("host", ["İstanbul.example", "BÜCHER.example", "straße.example"])
def test_the_domain_key_is_the_host_the_fetcher_resolves(
    client: TestClient, db_engine: Engine, make_tenant, host: str
) -> None:
    tenant, key = make_tenant("shop")
    url = f"http://{host}/page"
    expected = fetched_host_key(url)
    single = client.post("/jobs", json={"url": url}, headers=auth(key))
    assert single.status_code == 202, single.text
    batch = client.post("/jobs/batch", json={"jobs": [{"url": url + "?b"}]}, headers=auth(key))
    assert batch.status_code == 202, batch.text
    helper = repository.submit_job(db_engine, tenant.id, JobRequest(url + "?h", {}), None)
    ids = [single.json()["id"], batch.json()["items"][0]["receipt"]["id"], str(helper.id)]
    assert [job_domain(db_engine, i) for i in ids] == [expected] * 3

    # What the worker does after a 429 from the fetched host: every job of it waits.
    with db_engine.begin() as conn:
        conn.execute(repository._q("pause_domains"), {"domains": [expected], "paused_for": [600.0]})
    assert claim(db_engine, 10) == []


def test_host_spellings_the_fetcher_refuses_are_refused_at_intake(
    client: TestClient, db_engine: Engine, make_tenant
) -> None:
    tenant, key = make_tenant("shop")
    url = "http://ℌost.example/page"
    with pytest.raises(requests.exceptions.InvalidURL):
        requests.Request("GET", url).prepare()
    answer = client.post("/jobs", json={"url": url}, headers=auth(key))
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["pointer"] == "/url"
    batch = client.post("/jobs/batch", json={"jobs": [{"url": url}]}, headers=auth(key))
    assert batch.json()["items"][0]["status"] == 422
    with pytest.raises(DBAPIError) as refused:
        sql_submit(db_engine, tenant.id, url)
    assert refused.value.orig.sqlstate == "22023"  # type: ignore[union-attr]


def test_an_atomic_batch_points_a_reused_key_at_the_job_that_reused_it(
    client: TestClient, make_tenant
) -> None:
    _, key = make_tenant("shop")
    answer = client.post(
        "/jobs/batch",
        json={
            "atomic": True,
            "jobs": [
                {"url": "http://example.com/0"},
                {"url": "http://example.com/1", "idempotency_key": "k"},
                {"url": "http://example.com/2", "idempotency_key": "k"},
            ],
        },
        headers=auth(key),
    )
    assert answer.status_code == 422, answer.text
    assert [e["pointer"] for e in answer.json()["errors"]] == ["/jobs/2/idempotency_key"]


@pytest.mark.parametrize(
    "url",
    [
        "http://" + "a" * 64 + ".example/page",
        "http://x." + "b" * 64 + "/page",
        "http://bücher." + "c" * 64 + ".example/page",
    ],
)
def test_a_label_longer_than_dns_allows_is_refused_at_every_door(
    client: TestClient, db_engine: Engine, make_tenant, url: str
) -> None:
    """A DNS label is at most 63 octets: the fetcher refuses the URL (invalid_url, the job
    failed after its 202), so every door refuses it, naming the field."""
    tenant, key = make_tenant("shop")
    fetcher = Fetcher(FetchPolicy(timeout_seconds=5))
    with pytest.raises(FetchError) as at_fetch:
        fetcher.fetch(url)
    assert at_fetch.value.error_class == "invalid_url"

    answer = client.post("/jobs", json={"url": url}, headers=auth(key))
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["pointer"] == "/url"
    hook = client.post(
        "/jobs", json={"url": "http://ok.example/", "callback_url": url}, headers=auth(key)
    )
    assert hook.status_code == 422, hook.text
    assert hook.json()["errors"][0]["pointer"] == "/callback_url"
    batch = client.post("/jobs/batch", json={"jobs": [{"url": url}]}, headers=auth(key))
    assert batch.json()["items"][0]["status"] == 422
    with pytest.raises(repository.JobRejected, match="63"):
        repository.submit_job(db_engine, tenant.id, JobRequest(url, {}), None)
    if url.isascii():  # SQL asks for the xn-- form of a non-ASCII host first
        with pytest.raises(DBAPIError) as refused:
            sql_submit(db_engine, tenant.id, url)
        assert refused.value.orig.sqlstate == "22023"  # type: ignore[union-attr]
        assert "63" in str(refused.value.orig)
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one() == 0


@pytest.mark.parametrize(
    "host", ["0x7f.1", "2130706433", "127.1", "0177.0.0.1", "0x7f.0.0.1", "127.0.0.01"]
)
def test_an_ipv4_address_in_another_spelling_is_refused_at_every_door(
    client: TestClient, db_engine: Engine, make_tenant, host: str
) -> None:
    """The fetcher connects to 127.0.0.1 for each of these (getaddrinfo reads them as
    inet_aton does), while their keys were the spellings: one address under as many
    politeness keys as a client writes (0x0…7f.1: without end), each with its own rate.
    Refused at every door, naming the field; 127.0.0.1 is accepted, keyed as itself."""
    assert {a[4][0] for a in socket.getaddrinfo(host, 80, socket.AF_INET)} == {"127.0.0.1"}
    tenant, key = make_tenant("shop")
    url = f"http://{host}/page"
    answer = client.post("/jobs", json={"url": url}, headers=auth(key))
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["pointer"] == "/url"
    hook = client.post(
        "/jobs", json={"url": "http://ok.example/", "callback_url": url}, headers=auth(key)
    )
    assert hook.status_code == 422, hook.text
    assert hook.json()["errors"][0]["pointer"] == "/callback_url"
    batch = client.post("/jobs/batch", json={"jobs": [{"url": url}]}, headers=auth(key))
    assert batch.json()["items"][0]["status"] == 422
    with pytest.raises(repository.JobRejected, match="a.b.c.d"):
        repository.submit_job(db_engine, tenant.id, JobRequest(url, {}), None)
    with pytest.raises(DBAPIError) as refused:
        sql_submit(db_engine, tenant.id, url)
    assert refused.value.orig.sqlstate == "22023"  # type: ignore[union-attr]
    assert "a.b.c.d" in str(refused.value.orig)

    canonical = client.post("/jobs", json={"url": "http://127.0.0.1./page"}, headers=auth(key))
    assert canonical.status_code == 202, canonical.text
    assert job_domain(db_engine, canonical.json()["id"]) == "127.0.0.1"
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one() == 1
