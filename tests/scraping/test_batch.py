"""POST /jobs/batch: up to 1,000 jobs in one transaction through the intake path of POST
/jobs; each job's receipt or problem in order; a refused job is refused alone unless the
batch is atomic; the intake limit counts jobs, not requests."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.conftest import auth, checkouts_and_commits, limited_client


def stored(engine: Engine) -> dict[uuid.UUID, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, url, priority, idempotency_key, tenant_id FROM scraping.jobs")
        ).all()
    return {r.id: r for r in rows}


def test_each_job_gets_its_receipt_or_its_problem_in_order(
    client: TestClient, make_tenant, db_engine: Engine
) -> None:
    tenant, key = make_tenant("crawler")
    jobs = [
        {"url": "https://example.com/a", "priority": "high"},
        {"url": "ftp://example.com/b"},
        {"url": "https://example.com/c", "idempotency_key": "c-1"},
        {"url": "https://example.com/d", "colour": "red"},
        {"url": "https://example.com/e", "params": {"q": 1}},
    ]
    answer = client.post("/jobs/batch", json={"jobs": jobs}, headers=auth(key))
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert (body["accepted"], body["refused"]) == (3, 2)
    assert [i["index"] for i in body["items"]] == [0, 1, 2, 3, 4]
    assert [i["status"] for i in body["items"]] == [202, 422, 202, 422, 202]
    refused_url, refused_extra = body["items"][1]["problem"], body["items"][3]["problem"]
    assert [e["pointer"] for e in refused_url["errors"]] == ["/jobs/1/url"]
    assert [e["pointer"] for e in refused_extra["errors"]] == ["/jobs/3/colour"]
    assert refused_url["status"] == 422 and refused_url["type"].endswith("validation-error")
    rows = stored(db_engine)
    receipts = [i["receipt"] for i in body["items"] if i["status"] == 202]
    assert {uuid.UUID(r["id"]) for r in receipts} == set(rows)
    assert all(
        r["status"] == "queued" and r["links"]["self"] == f"/jobs/{r['id']}" for r in receipts
    )
    by_url = {r.url: r for r in rows.values()}
    assert by_url["https://example.com/a"].priority == "high"
    assert by_url["https://example.com/c"].idempotency_key == "c-1"
    assert {r.tenant_id for r in rows.values()} == {tenant.id}
    # Each is an ordinary job of the tenant's.
    first = uuid.UUID(receipts[0]["id"])
    assert client.get(f"/jobs/{first}", headers=auth(key)).json()["url"] == "https://example.com/a"


def test_an_atomic_batch_with_a_refused_job_stores_nothing(
    client: TestClient, make_tenant, db_engine: Engine
) -> None:
    _, key = make_tenant("crawler")
    jobs = [{"url": "https://example.com/a"}, {"url": "https://example.com/b"}, {"url": "x"}]
    answer = client.post("/jobs/batch", json={"jobs": jobs, "atomic": True}, headers=auth(key))
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert [e["pointer"] for e in answer.json()["errors"]] == ["/jobs/2/url"]
    assert stored(db_engine) == {}


def test_idempotency_keys_per_job_replay_and_a_reused_key_is_refused_alone(
    client: TestClient, make_tenant, db_engine: Engine
) -> None:
    _, key = make_tenant("crawler")
    jobs = [{"url": f"https://example.com/{n}", "idempotency_key": f"k{n}"} for n in range(3)]
    first = client.post("/jobs/batch", json={"jobs": jobs}, headers=auth(key)).json()
    again = client.post("/jobs/batch", json={"jobs": jobs}, headers=auth(key)).json()
    ids = [i["receipt"]["id"] for i in first["items"]]
    assert [i["receipt"]["id"] for i in again["items"]] == ids  # the same jobs
    assert len(stored(db_engine)) == 3

    changed = [*jobs[:2], {**jobs[2], "priority": "low"}, {"url": "https://example.com/new"}]
    answer = client.post("/jobs/batch", json={"jobs": changed}, headers=auth(key)).json()
    assert [i["status"] for i in answer["items"]] == [202, 202, 422, 202]
    [error] = answer["items"][2]["problem"]["errors"]
    assert error["pointer"] == "/jobs/2/idempotency_key"
    assert len(stored(db_engine)) == 4

    # Atomic: the reused key rolls back the jobs inserted before it in the transaction.
    atomic = [{"url": "https://example.com/x"}, {"url": "https://example.com/y"}, changed[2]]
    refused = client.post("/jobs/batch", json={"jobs": atomic, "atomic": True}, headers=auth(key))
    assert refused.status_code == 422, refused.text
    assert [e["pointer"] for e in refused.json()["errors"]] == ["/jobs/2/idempotency_key"]
    assert len(stored(db_engine)) == 4


def test_a_key_replays_across_post_jobs_and_the_batch_and_a_changed_body_is_refused(
    client: TestClient, make_tenant
) -> None:
    # One fingerprint for both paths: submit_job's and insert_jobs' (which gives one only
    # to a job with a key).
    _, key = make_tenant("crawler")
    job = {"url": "https://example.com/a", "params": {"q": "é", "n": [1, 2.5]}}
    single = client.post("/jobs", json=job, headers={**auth(key), "Idempotency-Key": "s-1"})
    assert single.status_code == 202, single.text
    batch = [{**job, "idempotency_key": "s-1"}, {**job, "idempotency_key": "b-1"}]
    answer = client.post("/jobs/batch", json={"jobs": batch}, headers=auth(key)).json()
    assert answer["items"][0]["receipt"]["id"] == single.json()["id"]
    again = client.post("/jobs", json=job, headers={**auth(key), "Idempotency-Key": "b-1"})
    assert again.status_code == 202, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == answer["items"][1]["receipt"]["id"]

    changed = {**job, "priority": "low"}
    refused = client.post("/jobs", json=changed, headers={**auth(key), "Idempotency-Key": "b-1"})
    assert refused.status_code == 422, refused.text
    answer = client.post(
        "/jobs/batch", json={"jobs": [{**changed, "idempotency_key": "s-1"}]}, headers=auth(key)
    ).json()
    assert answer["items"][0]["status"] == 422


def test_the_intake_limit_counts_jobs_not_requests(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    _, key = make_tenant("crawler")
    # 0.01 jobs/s: one token back per 100 s, so nothing refills within the test.
    with limited_client(db_engine, local_store, rps=0.01, burst=5) as client:
        four = [{"url": f"https://example.com/{n}"} for n in range(4)]
        answer = client.post("/jobs/batch", json={"jobs": four}, headers=auth(key))
        assert answer.status_code == 202, answer.text
        assert answer.headers["RateLimit"].startswith('"intake";r=1;')
        assert answer.headers["RateLimit-Policy"] == '"intake";q=5;w=500'
        two = client.post("/jobs/batch", json={"jobs": four[:2]}, headers=auth(key))
        assert two.status_code == 429, two.text
        assert two.headers["Retry-After"] == "100" and two.json()["limit"] == "intake"
        assert len(stored(db_engine)) == 4  # the refused batch stored nothing
        # The token left is a single job's.
        one = client.post("/jobs", json={"url": "https://example.com/one"}, headers=auth(key))
        assert one.status_code == 202
        too_many = [{"url": f"https://example.com/m{n}"} for n in range(6)]
        over = client.post("/jobs/batch", json={"jobs": too_many}, headers=auth(key))
        assert over.status_code == 422 and "PIN_SCRAPING_INTAKE_BURST" in over.json()["detail"]


def test_a_batch_takes_its_tokens_and_stores_its_jobs_in_one_transaction(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    """As POST /jobs: one connection and one commit (one WAL flush) for the tokens and the
    jobs, so an atomic batch that stores nothing spends no token."""
    _, key = make_tenant("crawler")
    with limited_client(db_engine, local_store, rps=0.001, burst=10) as client:
        assert client.get("/jobs", headers=auth(key)).status_code == 200  # the key is known
        three = [{"url": f"https://example.com/{n}"} for n in range(3)]
        with checkouts_and_commits(db_engine) as seen:
            first = client.post("/jobs/batch", json={"jobs": three}, headers=auth(key))
        assert first.status_code == 202, first.text
        assert seen == {"checkout": 1, "commit": 1}
        assert first.headers["RateLimit"].startswith('"intake";r=7;')

        keyed = [{"url": "https://example.com/k", "idempotency_key": "k1"}]
        assert (
            client.post("/jobs/batch", json={"jobs": keyed}, headers=auth(key)).status_code == 202
        )
        reused = [
            {"url": "https://example.com/other", "idempotency_key": "k1"},
            {"url": "https://example.com/new"},
        ]
        refused = client.post(
            "/jobs/batch", json={"jobs": reused, "atomic": True}, headers=auth(key)
        )
        assert refused.status_code == 422, refused.text
        last = client.post("/jobs/batch", json={"jobs": three[:1]}, headers=auth(key))
        assert last.status_code == 202, last.text
        # 10 - 3 - 1 - 1: the refused batch's two tokens are still in the bucket.
        assert last.headers["RateLimit"].startswith('"intake";r=5;'), last.headers["RateLimit"]
    assert len(stored(db_engine)) == 5


def test_a_thousand_jobs_fit_and_a_thousand_and_one_do_not(
    db_engine: Engine, local_store: LocalResultStore, make_tenant
) -> None:
    _, key = make_tenant("crawler")
    with limited_client(db_engine, local_store, rps=0, burst=1) as client:
        query = "x" * 40
        jobs = [{"url": f"https://example.com/page/{n:04d}?q={query}"} for n in range(1001)]
        over = client.post("/jobs/batch", json={"jobs": jobs}, headers=auth(key))
        assert over.status_code == 422
        assert [e["pointer"] for e in over.json()["errors"]] == ["/jobs"]
        # Over POST /jobs' 64 KiB body limit, within the batch's.
        answer = client.post("/jobs/batch", json={"jobs": jobs[:1000]}, headers=auth(key))
        assert answer.status_code == 202, answer.text[:500]
        assert answer.json()["accepted"] == 1000
        assert len(answer.request.content) > 64 * 1024
    assert len(stored(db_engine)) == 1000


def test_a_batch_takes_the_fair_tags_and_queues_of_the_same_jobs_submitted_one_by_one(
    make_tenant, db_engine: Engine
) -> None:
    """The batch reserves its fair tags a run per class and announces its domain queues
    once per (domain, class) (migration 0018): the scheduler's state it leaves is what the
    same jobs accepted one at a time leave, paused domains, new domains, weights and a
    tenant already ahead of the class clock included."""
    from pin_orchestration.scraping.store import repository

    batcher, _ = make_tenant("batcher")
    single, _ = make_tenant("one-by-one")
    with db_engine.begin() as conn:
        conn.execute(
            text("UPDATE scraping.tenants SET weight = 2.5 WHERE id = ANY(:ids)"),
            {"ids": [batcher.id, single.id]},
        )
        for prefix in ("a", "b"):
            conn.execute(
                text("SELECT scraping.pause_domain(:d, now() + interval '5 minutes')"),
                {"d": f"{prefix}0.example"},
            )

    def requests(prefix: str) -> list[repository.JobRequest]:
        return [
            repository.JobRequest(
                url=f"https://{prefix}{n % 7}.example/{n}",
                params={"n": n},
                priority=("high", "normal", "normal", "low")[n % 4],
            )
            for n in range(60)
        ]

    # Both tenants start ahead of the class clock by the same earlier job.
    for tenant, prefix in ((batcher, "a"), (single, "b")):
        repository.submit_job(db_engine, tenant.id, requests(prefix)[5], None)
    with db_engine.begin() as conn:
        answers = repository.submit_jobs(
            conn, batcher.id, [(r, None) for r in requests("a")], atomic=False
        )
    assert len(answers) == 60
    for request in requests("b"):
        repository.submit_job(db_engine, single.id, request, None)

    def scheduler_state(tenant_id: uuid.UUID, prefix: str) -> tuple[list, list]:
        with db_engine.connect() as conn:
            tags = conn.execute(
                text(
                    "SELECT priority, (params->>'n')::int AS n, fair_tag FROM scraping.jobs"
                    " WHERE tenant_id = :t ORDER BY n, fair_tag"
                ),
                {"t": tenant_id},
            ).all()
            queues = conn.execute(
                text(
                    "SELECT substr(domain, 2) AS host, priority, head_tag, ready, waiting_for,"
                    " wake_at FROM scraping.domain_queues WHERE domain LIKE :p"
                    " ORDER BY 1, 2"
                ),
                {"p": f"{prefix}%"},
            ).all()
        return [tuple(r) for r in tags], [tuple(r) for r in queues]

    batch_tags, batch_queues = scheduler_state(batcher.id, "a")
    single_tags, single_queues = scheduler_state(single.id, "b")
    assert [t[:2] for t in batch_tags] == [t[:2] for t in single_tags]
    for got, expected in zip(batch_tags, single_tags, strict=True):
        assert abs(got[2] - expected[2]) < 1e-9, (got, expected)
    assert len(batch_queues) == len(single_queues) == 7 * 3
    for got, expected in zip(batch_queues, single_queues, strict=True):
        assert got[:2] == expected[:2] and got[3:] == expected[3:], (got, expected)
        assert abs(got[2] - expected[2]) < 1e-9, (got, expected)
    paused = [q for q in batch_queues if q[0] == "0.example"]
    assert paused and all(q[4] == "room" and not q[3] for q in paused)
    with db_engine.connect() as conn:
        vtimes = conn.execute(
            text(
                "SELECT tenant_id = :a AS batcher, priority, vtime FROM scraping.tenant_vtimes"
                " WHERE tenant_id IN (:a, :b) ORDER BY priority, 1"
            ),
            {"a": batcher.id, "b": single.id},
        ).all()
    for one, batch in zip(vtimes[0::2], vtimes[1::2], strict=True):
        assert abs(one.vtime - batch.vtime) < 1e-9, vtimes
