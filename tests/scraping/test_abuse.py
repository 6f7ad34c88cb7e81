"""Abuse of the API (issue 11): the per-tenant intake rate limit, body and header size
limits, wrong and rotated keys, no secret in any log line, hostile strings stored byte for
byte."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.apiserver import api_process
from tests.scraping.conftest import TEST_SETTINGS, auth, checkouts_and_commits, limited_client


def job_count(db_engine: Engine) -> int:
    with db_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one()


# --- the intake rate limit -------------------------------------------------------------


def test_intake_past_the_burst_is_429_with_retry_after_naming_the_limit(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """A token per 1000 s: no starved test refills one between its posts (at 2/s, one came
    back before the fourth and it was taken). The Retry-After's wait is then passed in the
    bucket's own time (its refill moment moved back by it), not slept."""
    shop_tenant, shop = make_tenant("shop")
    _, other = make_tenant("other")
    with limited_client(db_engine, local_store, rps=0.001, burst=3) as client:
        for i in range(3):
            answer = client.post("/jobs", json={"url": f"https://e.com/{i}"}, headers=auth(shop))
            assert answer.status_code == 202, answer.text
        refused = client.post("/jobs", json={"url": "https://e.com/x"}, headers=auth(shop))
        assert refused.status_code == 429, refused.text
        retry_after = refused.headers["Retry-After"]
        # 1000 s for a token at 0.001/s, rounded up, less what refilled since the bucket ran
        # dry (a starved test's posts take seconds).
        assert retry_after.isdigit() and 950 <= int(retry_after) <= 1000, retry_after
        body = refused.json()
        assert body["limit"] == "intake"
        assert (body["rate_per_second"], body["burst"], body["retry_after_seconds"]) == (
            0.001,
            3,
            int(retry_after),
        )
        assert "PIN_SCRAPING_INTAKE_RPS" in body["detail"]
        assert job_count(db_engine) == 3  # a refusal stores nothing
        # a tenant's limit is its own
        assert (
            client.post("/jobs", json={"url": "https://e.com/o"}, headers=auth(other)).status_code
            == 202
        )
        # other endpoints are not intake
        assert client.get("/jobs", headers=auth(shop)).status_code == 200
        # Told to come back in `retry_after` s: once they have passed there is a token
        # again, and the bucket refills at 0.001/s only, so the next post meets a 429.
        with db_engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE scraping.intake_buckets"
                    " SET refilled_at = refilled_at - make_interval(secs => :wait)"
                    " WHERE tenant_id = :tenant"
                ),
                {"wait": int(retry_after), "tenant": shop_tenant.id},
            )
        statuses = [
            client.post(
                "/jobs", json={"url": f"https://e.com/r{i}"}, headers=auth(shop)
            ).status_code
            for i in range(2)
        ]
        assert statuses == [202, 429], statuses


def test_intake_answers_carry_the_ratelimit_header_fields_beside_retry_after(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """IETF httpapi RateLimit fields: the policy (q jobs at once, refilled over w s) and
    what is left (r jobs now, whole again in t s). 0.001 jobs/s: the bucket refills by a
    token per 1000 s, so a starved machine does not move r within the test."""
    import re

    _, shop = make_tenant("shop")
    with limited_client(db_engine, local_store, rps=0.001, burst=3) as client:
        answers = [
            client.post("/jobs", json={"url": f"https://e.com/{i}"}, headers=auth(shop))
            for i in range(4)
        ]
    assert [a.status_code for a in answers] == [202, 202, 202, 429]
    fields = re.compile(r'^"intake";r=(\d+);t=(\d+)$')
    for answer, left in zip(answers, (2, 1, 0, 0), strict=True):
        assert answer.headers["RateLimit-Policy"] == '"intake";q=3;w=3000'
        remaining, full_in = fields.match(answer.headers["RateLimit"]).groups()
        assert int(remaining) == left, answer.headers["RateLimit"]
        # Whole again once 3 - r tokens are back, 1000 s each (minus what refilled).
        assert (3 - left) * 1000 - 50 <= int(full_in) <= (3 - left) * 1000, answer.headers
    # The next token in 1000 s, less what refilled since the bucket ran dry (a loaded
    # machine took over a second between the third and the fourth POST).
    assert 950 <= int(answers[3].headers["Retry-After"]) <= 1000, answers[3].headers


def test_zero_rps_switches_the_limit_off(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    _, shop = make_tenant("shop")
    with limited_client(db_engine, local_store, rps=0, burst=1) as client:
        statuses = {
            client.post("/jobs", json={"url": f"https://e.com/{i}"}, headers=auth(shop)).status_code
            for i in range(10)
        }
        unlimited = client.post("/jobs", json={"url": "https://e.com/u"}, headers=auth(shop))
    assert statuses == {202}
    assert "RateLimit" not in unlimited.headers and "RateLimit-Policy" not in unlimited.headers
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.intake_buckets")).scalar() == 0


def test_an_idempotent_repeat_is_answered_while_the_bucket_is_empty(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    _, shop = make_tenant("shop")
    body = {"url": "https://e.com/order", "params": {"n": 17}}
    with limited_client(db_engine, local_store, rps=0.001, burst=1) as client:
        first = client.post("/jobs", json=body, headers={**auth(shop), "Idempotency-Key": "k1"})
        assert first.status_code == 202
        # the bucket is empty: a new job is refused…
        new = client.post("/jobs", json=body, headers={**auth(shop), "Idempotency-Key": "k2"})
        assert new.status_code == 429
        assert int(new.headers["Retry-After"]) >= 900  # 1 token at 0.001/s
        # …but the client retrying its lost 202 gets it back, as often as it asks
        for _ in range(3):
            again = client.post("/jobs", json=body, headers={**auth(shop), "Idempotency-Key": "k1"})
            assert again.status_code == 202, again.text
            assert again.json()["id"] == first.json()["id"]
            assert again.headers["Idempotent-Replayed"] == "true"
        # and the same key with another body is still the 422 naming the header
        changed = client.post(
            "/jobs",
            json={**body, "priority": "high"},
            headers={**auth(shop), "Idempotency-Key": "k1"},
        )
        assert changed.status_code == 422
        assert changed.json()["errors"][0]["parameter"] == "Idempotency-Key"
    assert job_count(db_engine) == 1


def test_intake_takes_its_token_and_stores_its_job_in_one_transaction(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """POST /jobs spends one connection and one commit (one WAL flush) on the token and
    the job together, so a request that stores nothing — a key reused with another body
    — spends no token."""
    _, shop = make_tenant("shop")
    with limited_client(db_engine, local_store, rps=0.001, burst=3) as client:
        assert client.get("/jobs", headers=auth(shop)).status_code == 200  # the key is known
        with checkouts_and_commits(db_engine) as seen:
            first = client.post("/jobs", json={"url": "https://e.com/a"}, headers=auth(shop))
        assert first.status_code == 202
        assert seen == {"checkout": 1, "commit": 1}

        keyed = {**auth(shop), "Idempotency-Key": "k1"}
        stored = client.post("/jobs", json={"url": "https://e.com/b"}, headers=keyed)
        assert stored.status_code == 202
        reused = client.post("/jobs", json={"url": "https://e.com/c"}, headers=keyed)
        assert reused.status_code == 422
        last = client.post("/jobs", json={"url": "https://e.com/d"}, headers=auth(shop))
        assert last.status_code == 202, last.text
        assert last.headers["RateLimit"].startswith('"intake";r=0;')
    assert job_count(db_engine) == 3


def test_concurrent_requests_never_take_more_than_the_burst(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    _, shop = make_tenant("shop")
    app = create_app(
        lambda: db_engine,
        local_store,
        dataclasses.replace(TEST_SETTINGS, intake_rps=0.001, intake_burst=7),
    )
    barrier = threading.Barrier(16)

    def post(i: int) -> int:
        with TestClient(app) as client:
            barrier.wait()
            return client.post(
                "/jobs", json={"url": f"https://e.com/{i}"}, headers=auth(shop)
            ).status_code

    with ThreadPoolExecutor(16) as pool:
        statuses = Counter(pool.map(post, range(16)))
    assert statuses == {202: 7, 429: 9}
    assert job_count(db_engine) == 7


def test_the_limit_holds_across_several_api_processes(
    db_url: str, db_engine: Engine, make_tenant, tmp_path: Path
) -> None:
    """Two `pin api` processes on one database: the tenant's bucket is one, not one each."""
    _, shop = make_tenant("shop")
    env = {"PIN_SCRAPING_INTAKE_RPS": "0.001", "PIN_SCRAPING_INTAKE_BURST": "10"}
    with (
        api_process(db_url, tmp_path / "a", env) as a,
        api_process(db_url, tmp_path / "b", env) as b,
    ):
        urls = [a.url, b.url] * 15

        def post(i: int) -> tuple[str, int, str | None]:
            answer = requests.post(
                f"{urls[i]}/jobs",
                json={"url": f"https://e.com/{i}"},
                headers=auth(shop),
                timeout=60,
            )
            return urls[i], answer.status_code, answer.headers.get("Retry-After")

        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(post, range(30)))
    statuses = Counter(status for _, status, _ in answers)
    assert statuses == {202: 10, 429: 20}
    # both processes refused: each saw the other's takes
    assert {url for url, status, _ in answers if status == 429} == {a.url, b.url}
    assert all(ra and ra.isdigit() for _, status, ra in answers if status == 429)
    assert job_count(db_engine) == 10


def test_intake_limit_settings_default_on_and_a_bad_value_names_the_variable() -> None:
    import pytest

    from pin_orchestration.platform.settings import SettingsError

    default = ScrapingSettings.from_env({})
    assert (default.intake_rps, default.intake_burst) == (28.0, 400)
    tuned = ScrapingSettings.from_env(
        {"PIN_SCRAPING_INTAKE_RPS": "0.5", "PIN_SCRAPING_INTAKE_BURST": "20"}
    )
    assert (tuned.intake_rps, tuned.intake_burst) == (0.5, 20)
    assert ScrapingSettings.from_env({"PIN_SCRAPING_INTAKE_RPS": "0"}).intake_rps == 0
    for name, value in [
        ("PIN_SCRAPING_INTAKE_RPS", "fast"),
        ("PIN_SCRAPING_INTAKE_RPS", "-1"),
        ("PIN_SCRAPING_INTAKE_RPS", "nan"),
        ("PIN_SCRAPING_INTAKE_BURST", "0"),
        ("PIN_SCRAPING_INTAKE_BURST", "2.5"),
    ]:
        with pytest.raises(SettingsError, match=name):
            ScrapingSettings.from_env({name: value})


# --- body and header size limits -------------------------------------------------------


def test_oversized_bodies_and_headers_through_a_real_uvicorn(
    db_url: str, make_tenant, tmp_path: Path, db_engine: Engine
) -> None:
    """What a client sees from `pin api` itself (uvicorn, httptools), not a TestClient."""
    import json

    from pin_orchestration.scraping.api.limits import MAX_BODY_BYTES, MAX_HEADER_BYTES

    _, key = make_tenant("shop")
    headers = {**auth(key), "Content-Type": "application/json"}
    big = json.dumps({"url": "https://e.com/", "params": {"blob": "x" * 1_000_000}}).encode()
    with api_process(db_url, tmp_path / "api") as api:
        # declared too large: refused from the Content-Length, before reading
        declared = requests.post(f"{api.url}/jobs", data=big, headers=headers, timeout=60)
        assert declared.status_code == 413, declared.text
        assert str(MAX_BODY_BYTES) in declared.json()["detail"]

        # chunked (no Content-Length): counted as it streams, cut at the limit
        def chunks():
            for i in range(0, len(big), 8192):
                yield big[i : i + 8192]

        streamed = requests.post(f"{api.url}/jobs", data=chunks(), headers=headers, timeout=60)
        assert streamed.request.headers.get("Transfer-Encoding") == "chunked"
        assert "Content-Length" not in streamed.request.headers
        assert streamed.status_code == 413, streamed.text
        assert str(MAX_BODY_BYTES) in streamed.json()["detail"]

        # just under the limit: read, and judged by the API (params over 16 KiB → 422)
        under = json.dumps({"url": "https://e.com/", "params": {"b": "x" * 60_000}}).encode()
        assert len(under) < MAX_BODY_BYTES
        for data in (under, iter([under[:30_000], under[30_000:]])):
            answer = requests.post(f"{api.url}/jobs", data=data, headers=headers, timeout=60)
            assert answer.status_code == 422, answer.text
            assert answer.json()["errors"][0]["pointer"] == "/params"

        # headers: one big one, or many small ones, over the limit in all
        for extra in (
            {"X-Padding": "a" * (MAX_HEADER_BYTES + 1)},
            {f"X-Pad-{i}": "a" * 100 for i in range(200)},
            {"X-Padding": "a" * 1_000_000},
        ):
            answer = requests.get(f"{api.url}/jobs", headers={**auth(key), **extra}, timeout=60)
            assert answer.status_code == 431, answer.text
            assert str(MAX_HEADER_BYTES) in answer.json()["detail"]

        # and the server is fine afterwards
        ok = requests.post(f"{api.url}/jobs", json={"url": "https://e.com/ok"}, headers=auth(key))
        assert ok.status_code == 202
    assert job_count(db_engine) == 1


# --- wrong, rotated keys; no secret in any log line -----------------------------------


def test_keys_are_compared_in_constant_time_on_their_digests(
    client: TestClient, make_tenant, monkeypatch
) -> None:
    import hashlib
    import hmac

    _, key = make_tenant("shop")
    digest = hashlib.sha256(key.encode()).digest()
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a, b):  # type: ignore[no-untyped-def]
        calls.append((bytes(a), bytes(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    assert client.get("/jobs", headers=auth(key)).status_code == 200  # PostgreSQL
    assert client.get("/jobs", headers=auth(key)).status_code == 200  # the key cache
    assert calls == [(digest, digest), (digest, digest)]
    calls.clear()
    for wrong in (key[:-1] + ("A" if key[-1] != "A" else "B"), key[:8], key + "x", "x" * 4000):
        assert client.get("/jobs", headers=auth(wrong)).status_code == 401
    # never the key itself: only 32-byte digests are ever compared
    assert all(len(a) == len(b) == 32 for a, b in calls)


def test_wrong_and_malformed_credentials_are_401(client: TestClient, make_tenant) -> None:
    _, key = make_tenant("shop")
    for headers in (
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {key}"},
        {"Authorization": f"Token {key}"},
        {"Authorization": f"Bearer {key.upper()}"},
        {"Authorization": f"Bearer {key} extra"},
        {"Authorization": "Bearer pin_' OR '1'='1"},
    ):
        answer = client.post("/jobs", json={"url": "https://e.com/"}, headers=headers)
        assert answer.status_code == 401, (headers, answer.text)
        assert answer.headers["WWW-Authenticate"] == "Bearer"
        assert key not in answer.text


def test_a_rotated_key_is_refused_by_every_api_process_despite_their_key_caches(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """Two API processes (two apps, two key caches) both remember the old key when it is
    rotated: each refuses it within the cache's bound and never accepts it again, and the
    new key works on both at once."""
    import time

    from pin_orchestration.scraping.store.tenancy import rotate_tenant_key

    _, old = make_tenant("shop")
    bound = 1.0
    apps = [
        create_app(lambda: db_engine, local_store, TEST_SETTINGS, api_key_cache_seconds=bound)
        for _ in range(2)
    ]
    with TestClient(apps[0]) as one, TestClient(apps[1]) as two:
        for c in (one, two):
            assert c.get("/jobs", headers=auth(old)).status_code == 200
        _, new = rotate_tenant_key(db_engine, "shop")
        rotated = time.monotonic()
        for c in (one, two):
            assert c.get("/jobs", headers=auth(new)).status_code == 200
        # Timed at the request's departure, not at its answer: each process cached the old
        # key before the rotation, so a request sent `bound` after it finds the entry
        # expired, however long a loaded machine then takes to answer.
        for c in (one, two):
            while True:
                sent = time.monotonic()
                if c.get("/jobs", headers=auth(old)).status_code == 401:
                    break
                assert sent - rotated < bound, "old key accepted past the cache's bound"
                time.sleep(0.02)
        time.sleep(bound)  # past any entry a late request could have left
        for c in (one, two):
            assert c.get("/jobs", headers=auth(old)).status_code == 401
            assert (
                c.post("/jobs", json={"url": "https://e.com/"}, headers=auth(old)).status_code
                == 401
            )
            assert c.get("/jobs", headers=auth(new)).status_code == 200


def test_no_api_key_or_webhook_secret_in_any_log_line(
    db_url: str,
    db_engine: Engine,
    local_store: LocalResultStore,
    make_tenant,
    work,
    site,
    tmp_path: Path,
    caplog,
) -> None:
    """Everything logged at DEBUG in this process (the API, worker, webhook delivery,
    repository) and by a real `uvicorn` with its access log on, while tenants are created,
    jobs with callbacks submitted, fetched and announced, keys and secrets rotated, and
    wrong keys tried — none of the keys or secrets appears."""
    import logging
    import random

    from pin_orchestration.scraping.fetch.client import Fetcher
    from pin_orchestration.scraping.policies import webhook_fetch_policy_from
    from pin_orchestration.scraping.store.tenancy import rotate_tenant_key
    from pin_orchestration.scraping.webhooks.deliveries import run_deliveries, tenant_webhook_secret
    from pin_orchestration.scraping.webhooks.options import DeliveryOptions, WebhookPolicy
    from tests.scraping.conftest import _with_allowed
    from tests.scraping.test_webhooks import Receiver
    from tests.scraping.webhook_checks import assert_every_delivery_verifies

    caplog.set_level(logging.DEBUG)
    secrets: list[str] = []
    shop, key = make_tenant("shop")
    secrets.append(key)
    secrets.append(tenant_webhook_secret(db_engine, "shop")["webhook_secret"])
    receiver = Receiver()
    try:
        app = create_app(lambda: db_engine, local_store, TEST_SETTINGS)
        with TestClient(app) as client:
            for i, path in enumerate(("/page/hello", "/status/404")):
                answer = client.post(
                    "/jobs",
                    json={"url": f"{site.url}{path}", "callback_url": receiver.url(f"/h{i}")},
                    headers={**auth(key), "Idempotency-Key": f"k{i}"},
                )
                assert answer.status_code == 202, answer.text
            work()
            secrets.append(tenant_webhook_secret(db_engine, "shop", rotate=True)["webhook_secret"])
            settings = _with_allowed(TEST_SETTINGS, "127.0.0.1/32")
            with Fetcher(webhook_fetch_policy_from(settings)) as fetcher:
                run_deliveries(
                    db_engine,
                    fetcher,
                    WebhookPolicy(
                        max_attempts=2,
                        backoff_base_seconds=1,
                        backoff_cap_seconds=1,
                        timeout_seconds=2.5,
                    ),
                    DeliveryOptions(batch_size=10),
                    rng=random.Random(1),
                )
            assert len(receiver.received) == 2
            assert_every_delivery_verifies(db_engine, receiver.received)
            _, new_key = rotate_tenant_key(db_engine, "shop")
            secrets.append(new_key)
            wrong = "pin_" + "w" * 43
            secrets.append(wrong)
            assert client.get("/jobs", headers=auth(wrong)).status_code == 401
            assert client.get("/jobs", headers=auth(new_key)).status_code == 200
    finally:
        receiver.close()

    with api_process(
        db_url,
        tmp_path / "api",
        uvicorn_args=("--access-log", "--log-level", "debug"),
    ) as api:
        for k in (key, new_key, wrong):
            requests.post(
                f"{api.url}/jobs?note=x",
                json={"url": "https://e.com/", "callback_url": "https://e.com/hook"},
                headers=auth(k),
                timeout=60,
            )
            requests.get(f"{api.url}/jobs", headers=auth(k), timeout=60)
        server_log = api.log()
    in_process = "\n".join(
        [caplog.text] + [str(r.__dict__) for r in caplog.records]  # args, extras and exceptions too
    )
    assert "POST /jobs?note=x" in server_log and "401" in server_log  # the access log ran
    assert "webhook" in in_process.lower() or "job" in in_process.lower()
    for secret in secrets:
        assert secret not in server_log, "a key or secret in uvicorn's log"
        assert secret not in in_process, "a key or secret in a log record"
        assert secret[:16] not in server_log + in_process


# --- hostile strings stored and returned byte for byte ---------------------------------

HOSTILE = [
    "'",
    '"',
    "`",
    "\\",
    "; DROP TABLE scraping.jobs; --",
    "' OR '1'='1",
    "'); DELETE FROM scraping.tenants; --",
    "$(rm -rf /)",
    "`rm -rf /`",
    "| cat /etc/passwd",
    "&& shutdown -h now",
    "${IFS}",
    "%00",
    "%27%20OR%201=1--",
    "%%",
    "%s%n%x",
    "{{7*7}}",
    "<script>alert(1)</script>",
    "\u202e\u200b\ufeff",
    "😀👩‍👩‍👧‍👦🏳️‍🌈",
    "Ω≈ç√∫",
    "\r\n",
    "\t",
    "$1",
    ":name",
    "?",
    "E'\\x41'",
    "$$;$$",
]


def _hostile_text():  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    # any Unicode but NUL (jsonb refuses it: a 422 of its own) and lone surrogates (not
    # encodable as UTF-8), mixed with the classic injection snippets
    chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
    return st.lists(
        st.one_of(st.sampled_from(HOSTILE), st.text(chars, max_size=8)), max_size=6
    ).map("".join)


def _url_path():  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    # what a URL may hold after the host (no whitespace, no NUL): quotes, backticks, $(),
    # ;, percent-encodings, non-ASCII
    chars = st.characters(
        exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc"), exclude_characters="\x00"
    )
    snippets = [s for s in HOSTILE if not any(c.isspace() for c in s) and "\x00" not in s]
    return st.lists(
        st.one_of(st.sampled_from(snippets), st.text(chars, max_size=6)), max_size=6
    ).map("".join)


def test_hostile_urls_and_params_come_back_byte_for_byte(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """`params` and URLs full of SQL and shell metacharacters, percent-encodings and any
    Unicode are stored and returned exactly — by GET /jobs/{id}, by the list, and in the
    row itself."""
    import json

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    _, key = make_tenant("shop")
    app = create_app(
        lambda: db_engine, local_store, dataclasses.replace(TEST_SETTINGS, intake_rps=0)
    )
    values = st.recursive(
        st.one_of(_hostile_text(), st.integers(-(2**53), 2**53), st.booleans(), st.none()),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(_hostile_text(), inner, max_size=4)
        ),
        max_leaves=12,
    )
    params_strategy = st.dictionaries(_hostile_text(), values, max_size=5)

    accepted: list[str] = []
    with TestClient(app) as client:

        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(path=_url_path(), query=_url_path(), params=params_strategy)
        def round_trip(path: str, query: str, params: dict) -> None:
            url = f"https://example.com/{path}?q={query}"
            body = {"url": url, "params": params, "callback_url": f"https://cb.example/{path}"}
            answer = client.post("/jobs", json=body, headers=auth(key))
            if answer.status_code == 422:  # only when the URL parser refuses the path
                assert answer.json()["errors"][0]["pointer"] in ("/url", "/callback_url"), (
                    answer.text
                )
                return
            assert answer.status_code == 202, answer.text
            job_id = answer.json()["id"]
            accepted.append(job_id)
            view = client.get(f"/jobs/{job_id}", headers=auth(key))
            assert view.status_code == 200
            job = view.json()
            assert job["url"] == url and job["callback_url"] == body["callback_url"]
            assert job["params"] == params
            # the same bytes: the JSON of what was sent and of what came back
            assert json.dumps(job["params"], sort_keys=True) == json.dumps(params, sort_keys=True)
            assert job["url"].encode() == url.encode()
            [listed] = client.get("/jobs", params={"limit": 1}, headers=auth(key)).json()["items"]
            assert listed["id"] == job_id
            assert listed["url"] == url and listed["params"] == params
            with db_engine.connect() as conn:
                row = conn.execute(
                    text("SELECT url, params FROM scraping.jobs WHERE id = :id"), {"id": job_id}
                ).one()
            assert row.url == url and row.params == params

        round_trip()
    assert len(accepted) >= 30, f"only {len(accepted)} of the examples were accepted"
    with db_engine.connect() as conn:  # and every table is still there
        assert conn.execute(text("SELECT count(*) FROM scraping.tenants")).scalar() == 1
