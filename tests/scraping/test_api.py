"""The intake and query API against real PostgreSQL (SCR-1, SCR-2)."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from datetime import datetime

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.api.job_models import URL_PATTERN
from tests.scraping.conftest import TEST_SETTINGS, Worker, auth

ENDPOINTS = [
    ("GET", "/jobs/{id}"),
    ("GET", "/jobs/{id}/result"),
    ("POST", "/jobs/{id}/cancel"),
    ("GET", "/jobs/{id}/attempts"),
]


def submit(client: TestClient, key: str, body: dict, **headers: str) -> dict:
    answer = client.post("/jobs", json=body, headers={**auth(key), **headers})
    assert answer.status_code == 202, answer.text
    return answer.json()


def test_submit_answers_202_with_a_receipt_and_never_touches_the_target(
    client: TestClient, make_tenant, site: ScrapingTarget
) -> None:
    _, key = make_tenant("shop")
    receipt = submit(client, key, {"url": f"{site.url}/page/a", "params": {"q": "x"}})
    assert receipt["status"] == "queued"
    assert receipt["links"]["self"] == f"/jobs/{receipt['id']}"
    assert len(site.requests) == 0

    job = client.get(receipt["links"]["self"], headers=auth(key)).json()
    assert job["status"] == "queued"
    assert job["url"] == f"{site.url}/page/a"
    assert job["params"] == {"q": "x"}
    assert job["priority"] == "normal"
    assert job["attempts"] == 0
    assert job["last_error"] is None and job["result"] is None
    created = datetime.fromisoformat(job["created_at"])
    assert created.utcoffset() is not None and job["created_at"].endswith("+00:00")


@pytest.mark.parametrize("method,path", [("POST", "/jobs"), ("GET", "/jobs"), *ENDPOINTS])
def test_every_endpoint_wants_a_valid_key(client: TestClient, method: str, path: str) -> None:
    path = path.format(id=uuid.uuid4())
    body = {"url": "https://example.com/"} if method == "POST" else None
    missing = client.request(method, path, json=body)
    wrong = client.request(method, path, json=body, headers=auth("pin_not-a-key"))
    assert missing.status_code == 401
    assert wrong.status_code == 401
    assert missing.headers["WWW-Authenticate"] == "Bearer"


def test_another_tenants_job_is_404_on_every_endpoint(client: TestClient, make_tenant) -> None:
    _, shop = make_tenant("shop")
    _, crawler = make_tenant("crawler")
    job = submit(client, shop, {"url": "https://example.com/a"})
    for method, path in ENDPOINTS:
        answer = client.request(method, path.format(id=job["id"]), headers=auth(crawler))
        assert answer.status_code == 404, (method, path, answer.text)
    listed = client.get("/jobs", headers=auth(crawler)).json()
    assert listed == {"items": [], "next_cursor": None}
    # and the owner still sees it, untouched by the other tenant's cancel
    assert client.get(f"/jobs/{job['id']}", headers=auth(shop)).json()["status"] == "queued"


@pytest.mark.parametrize(
    "body,field",
    [
        ({"url": "ftp://example.com/file"}, "url"),
        ({"url": "https:///no-host"}, "url"),
        ({"url": "https://example.com/" + "a" * 2048}, "url"),
        ({"url": "https://example.com/", "priority": "urgent"}, "priority"),
        ({"url": "https://example.com/", "params": {"blob": "x" * 16_400}}, "params"),
        ({"url": "https://example.com/", "callback_url": "javascript:alert(1)"}, "callback_url"),
        ({"url": "https://example.com/", "params": {"nul": "a\u0000b"}}, "params"),
        ({"url": "https://example.com/", "colour": "red"}, "colour"),
        ({}, "url"),
    ],
)
def test_bad_input_is_422_naming_the_field(
    client: TestClient, make_tenant, body: dict, field: str, db_engine: Engine
) -> None:
    _, key = make_tenant("shop")
    answer = client.post("/jobs", json=body, headers=auth(key))
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert answer.headers["content-type"] == "application/problem+json"
    assert problem["status"] == 422 and problem["type"].endswith("validation-error")
    # The JSON Pointer names the field (its first segment: "/params", or "/colour").
    assert any(e["pointer"].split("/")[1] == field for e in problem["errors"]), answer.text
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar() == 0


@pytest.mark.parametrize(
    "body,field",
    [
        ({"url": "ftp://example.com/file"}, "url"),
        ({"url": "example.com/page"}, "url"),
        ({"url": "https://example.com/", "callback_url": "javascript:alert(1)"}, "callback_url"),
    ],
)
def test_a_url_that_is_not_http_is_refused_in_words_naming_the_field(
    client: TestClient, make_tenant, body: dict, field: str
) -> None:
    _, key = make_tenant("shop")
    answer = client.post("/jobs", json=body, headers=auth(key))
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert error["pointer"] == f"/{field}"
    assert f"{field} must be an http:// or https:// URL" in error["detail"]
    assert "pattern" not in error["detail"] and "[Hh]" not in answer.text
    # The schema still tells clients (and the fuzzer) the shape of a URL.
    schema = client.get("/openapi.json").json()["components"]["schemas"]["JobCreate"]
    assert schema["properties"]["url"]["pattern"] == URL_PATTERN


def test_idempotency_key_returns_the_same_job_and_rejects_another_body(
    client: TestClient, make_tenant
) -> None:
    _, shop = make_tenant("shop")
    _, other = make_tenant("other")
    body = {"url": "https://example.com/a", "priority": "high"}
    first = submit(client, shop, body, **{"Idempotency-Key": "order-17"})
    again = client.post("/jobs", json=body, headers={**auth(shop), "Idempotency-Key": "order-17"})
    assert again.status_code == 202
    assert again.json()["id"] == first["id"]
    assert again.headers["Idempotent-Replayed"] == "true"

    changed = client.post(
        "/jobs",
        json={**body, "priority": "low"},
        headers={**auth(shop), "Idempotency-Key": "order-17"},
    )
    assert changed.status_code == 422
    [error] = changed.json()["errors"]
    assert (error["parameter"], error["in"]) == ("Idempotency-Key", "header")
    # keys are per tenant
    theirs = submit(client, other, body, **{"Idempotency-Key": "order-17"})
    assert theirs["id"] != first["id"]


def test_two_concurrent_identical_posts_make_one_job(
    api_app: FastAPI, make_tenant, db_engine: Engine
) -> None:
    _, key = make_tenant("shop")
    barrier = threading.Barrier(8)
    answers: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def post() -> None:
        try:
            with TestClient(api_app) as own_client:
                barrier.wait()
                answer = own_client.post(
                    "/jobs",
                    json={"url": "https://example.com/same"},
                    headers={**auth(key), "Idempotency-Key": "same-key"},
                )
                answers.append((answer.status_code, answer.json()["id"]))
        except BaseException as exc:  # surfaced below: a thread's error must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert {status for status, _ in answers} == {202}
    assert len({job_id for _, job_id in answers}) == 1
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar() == 1


def test_list_is_own_jobs_newest_first_with_a_stable_cursor(
    client: TestClient, make_tenant
) -> None:
    _, key = make_tenant("shop")
    _, other = make_tenant("other")
    ids = [submit(client, key, {"url": f"https://example.com/{i}"})["id"] for i in range(7)]
    submit(client, other, {"url": "https://example.com/theirs"})
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/jobs", params=params, headers=auth(key)).json()
        seen += [item["id"] for item in page["items"]]
        # a job submitted while paging does not shift the pages already handed out
        if len(seen) == 3:
            submit(client, key, {"url": "https://example.com/late"})
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    client.post(f"/jobs/{ids[0]}/cancel", headers=auth(key))
    cancelled = client.get("/jobs", params={"status": "cancelled"}, headers=auth(key)).json()
    assert [item["id"] for item in cancelled["items"]] == [ids[0]]
    assert client.get("/jobs", params={"status": "done"}, headers=auth(key)).status_code == 422
    assert client.get("/jobs", params={"cursor": "x"}, headers=auth(key)).status_code == 422


def test_cancel_a_queued_job_at_once_and_a_terminal_one_is_409(
    client: TestClient, make_tenant
) -> None:
    _, key = make_tenant("shop")
    job = submit(client, key, {"url": "https://example.com/a"})
    answer = client.post(f"/jobs/{job['id']}/cancel", headers=auth(key))
    assert answer.status_code == 200
    assert answer.json() == {"id": job["id"], "status": "cancelled", "cancel_requested": False}
    view = client.get(f"/jobs/{job['id']}", headers=auth(key)).json()
    assert view["status"] == "cancelled" and view["finished_at"] is not None
    assert client.post(f"/jobs/{job['id']}/cancel", headers=auth(key)).status_code == 409


def test_result_is_409_until_succeeded_then_a_signed_url_with_the_exact_bytes(
    client: TestClient, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    _, key = make_tenant("shop")
    job = submit(client, key, {"url": f"{site.url}/slow/r", "params": {"ms": 0, "bytes": 3000}})
    pending = client.get(f"/jobs/{job['id']}/result", headers=auth(key))
    assert pending.status_code == 409
    assert "queued" in pending.json()["detail"]

    work()
    view = client.get(f"/jobs/{job['id']}", headers=auth(key)).json()
    assert view["status"] == "succeeded"
    assert view["result"]["size"] == 3000
    link = client.get(f"/jobs/{job['id']}/result", headers=auth(key)).json()
    assert datetime.fromisoformat(link["expires_at"]).utcoffset() is not None
    download = client.get(link["url"])  # no API key: the signature is the credential
    assert download.status_code == 200
    assert download.content == b"x" * 3000
    assert download.headers["content-type"] == "application/octet-stream"
    tampered = client.get(link["url"].replace("signature=", "signature=0"))
    assert tampered.status_code == 403


def test_attempts_tell_three_timeouts_then_a_401(
    client: TestClient, make_tenant, site: ScrapingTarget, work: Worker
) -> None:
    _, key = make_tenant("shop")
    job = submit(
        client,
        key,
        {"url": f"{site.url}/script/story", "params": {"steps": "sleep,sleep,sleep,401"}},
    )
    # The script's `sleep` hangs 5 s: a 1 s fetch timeout cuts each of them.
    work(
        settings=dataclasses.replace(TEST_SETTINGS, fetch_timeout_seconds=1.0),
        idle_exit_seconds=1.0,
    )
    view = client.get(f"/jobs/{job['id']}", headers=auth(key)).json()
    assert view["status"] == "failed"
    assert view["last_error_class"] == "http_401"
    items = client.get(f"/jobs/{job['id']}/attempts", headers=auth(key)).json()["items"]
    assert [(a["number"], a["outcome"], a["error_class"], a["http_status"]) for a in items] == [
        (1, "retry", "timeout", None),
        (2, "retry", "timeout", None),
        (3, "retry", "timeout", None),
        (4, "failed", "http_401", 401),
    ]
    assert all(a["duration_ms"] is not None and a["finished_at"] for a in items)


def test_a_rotated_key_stops_working_within_the_key_cache_bound(
    db_engine: Engine, local_store, make_tenant
) -> None:
    """API processes remember a matched key for api_key_cache_seconds: rotation revokes
    the old key within that bound, and the new key works at once."""
    import time

    from pin_orchestration.scraping.api.app import create_app
    from pin_orchestration.scraping.store.tenancy import rotate_tenant_key

    _, old_key = make_tenant("shop")
    app = create_app(lambda: db_engine, local_store, TEST_SETTINGS, api_key_cache_seconds=0.5)
    with TestClient(app) as client:
        assert client.get("/jobs", headers=auth(old_key)).status_code == 200
        _, new_key = rotate_tenant_key(db_engine, "shop")
        rotated = time.monotonic()
        assert client.get("/jobs", headers=auth(new_key)).status_code == 200
        # Timed at the request's departure: the key was cached before the rotation, so a
        # request sent 0.5 s after it finds the entry expired, however slow its answer.
        while True:
            sent = time.monotonic()
            if client.get("/jobs", headers=auth(old_key)).status_code != 200:
                break
            assert sent - rotated < 0.5, "old key accepted past the cache's bound"
            time.sleep(0.02)
        assert client.get("/jobs", headers=auth(old_key)).status_code == 401
        assert client.get("/jobs", headers=auth(new_key)).status_code == 200
