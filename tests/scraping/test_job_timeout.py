"""A job's own timeout (POST /jobs `timeout_seconds`): applied to its fetch, bounded by
the service's cap, shown on the job."""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.api.job_models import MAX_JOB_TIMEOUT_SECONDS
from tests.scraping.conftest import TEST_SETTINGS, Worker, auth


def test_a_jobs_own_timeout_cuts_its_fetch_and_the_service_default_does_not(
    db_engine: Engine, make_tenant, client: TestClient, site: ScrapingTarget, work: Worker
) -> None:
    _, key = make_tenant("shop")
    # The short job's page answers only once the test is over (its gate opens when the
    # site stops): its own 0.3 s is all that can end its fetch, however slow the machine.
    # The other's answers in 1.2 s, well within the service's timeout (TEST_SETTINGS).
    short = client.post(
        "/jobs",
        json={"url": f"{site.url}/held/a", "timeout_seconds": 0.3},
        headers=auth(key),
    ).json()["id"]
    default = client.post(
        "/jobs", json={"url": f"{site.url}/slow/b", "params": {"ms": 1200}}, headers=auth(key)
    ).json()["id"]
    assert client.get(f"/jobs/{short}", headers=auth(key)).json()["timeout_seconds"] == 0.3
    assert client.get(f"/jobs/{default}", headers=auth(key)).json()["timeout_seconds"] is None

    work(settings=dataclasses.replace(TEST_SETTINGS, max_attempts=1))

    assert client.get(f"/jobs/{default}", headers=auth(key)).json()["status"] == "succeeded"
    with db_engine.connect() as conn:
        first = conn.execute(
            text(
                "SELECT error_class, error_detail, duration_ms FROM scraping.job_attempts "
                "WHERE job_id = :id ORDER BY number LIMIT 1"
            ),
            {"id": short},
        ).one()
    assert first.error_class == "timeout", first
    # Cut by its own deadline: the service's would have held it for 60 s.
    assert first.duration_ms < TEST_SETTINGS.fetch_timeout_seconds * 1000, first


def test_a_timeout_beyond_the_cap_is_refused_naming_the_field(
    make_tenant, client: TestClient
) -> None:
    _, key = make_tenant("shop")
    for bad in (0, -1, MAX_JOB_TIMEOUT_SECONDS + 1):
        answer = client.post(
            "/jobs",
            json={"url": "http://127.0.0.2/a", "timeout_seconds": bad},
            headers=auth(key),
        )
        assert answer.status_code == 422, answer.text
        assert "timeout_seconds" in answer.text
    batch = client.post(
        "/jobs/batch",
        json={"jobs": [{"url": "http://127.0.0.2/a", "timeout_seconds": 5}]},
        headers=auth(key),
    )
    assert batch.status_code == 202, batch.text
    job_id = batch.json()["items"][0]["receipt"]["id"]
    assert client.get(f"/jobs/{job_id}", headers=auth(key)).json()["timeout_seconds"] == 5


def test_a_timeout_that_is_not_a_json_number_is_refused_at_every_door(
    make_tenant, client: TestClient
) -> None:
    """A string "5" and true were read as 5 and 1 second (lax parsing): a client's string or flag
    became a fetch timeout. A number is asked for; an integer is one."""
    _, key = make_tenant("shop")
    for bad in ("5", True, "abc", [], {}, 1e308, -0.0):
        single = client.post(
            "/jobs", json={"url": "http://127.0.0.2/a", "timeout_seconds": bad}, headers=auth(key)
        )
        assert single.status_code == 422, (bad, single.text)
        assert "timeout_seconds" in single.json()["detail"], single.text
        batch = client.post(
            "/jobs/batch",
            json={"jobs": [{"url": "http://127.0.0.2/a", "timeout_seconds": bad}]},
            headers=auth(key),
        )
        [item] = batch.json()["items"]
        assert item["status"] == 422, (bad, batch.text)
        assert "/jobs/0/timeout_seconds" in item["problem"]["detail"], batch.text
    for raw in (b"NaN", b"Infinity", b"1e999"):
        answer = client.post(
            "/jobs",
            content=b'{"url": "http://127.0.0.2/a", "timeout_seconds": ' + raw + b"}",
            headers={**auth(key), "Content-Type": "application/json"},
        )
        assert answer.status_code == 422, (raw, answer.text)
        assert "timeout_seconds" in answer.json()["detail"], answer.text
    for good in (5, 0.5, 600):
        answer = client.post(
            "/jobs", json={"url": "http://127.0.0.2/a", "timeout_seconds": good}, headers=auth(key)
        )
        assert answer.status_code == 202, (good, answer.text)
