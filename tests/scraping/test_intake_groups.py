"""Issue 30: concurrent POST /jobs of one tenant are written together (scraping/api/intake.py),
each request keeping its own answer."""

from __future__ import annotations

import threading
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from tests.scraping.conftest import auth, checkouts_and_commits, limited_client


def _wait_until(condition: Any, what: str) -> None:
    """Poll a condition the code under test reaches (a gate, not a timed sleep)."""
    import time

    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_posts_waiting_behind_a_write_are_written_in_one_transaction(
    client: TestClient, api_app: Any, db_engine: Engine, db_url: str, make_tenant
) -> None:
    _, key = make_tenant("shop")
    headers = auth(key)
    first = client.post("/jobs", json={"url": "http://a.example/first"}, headers=headers)
    assert first.status_code == 202
    keyed = client.post(
        "/jobs",
        json={"url": "http://a.example/keyed"},
        headers={**headers, "Idempotency-Key": "k1"},
    )
    assert keyed.status_code == 202

    # The gate: the tenant's fair-tag row, locked by another connection, holds the next
    # write inside its transaction while the other requests arrive.
    gate_engine = create_engine(db_url)
    gate = gate_engine.connect()
    gate.execute(text("SELECT 1 FROM scraping.tenant_vtimes FOR UPDATE")).all()

    answers: dict[str, Any] = {}

    def post(name: str, body: dict[str, str], extra: dict[str, str] | None = None) -> None:
        answers[name] = client.post("/jobs", json=body, headers={**headers, **(extra or {})})

    intake = api_app.state.intake
    with checkouts_and_commits(db_engine) as counted:
        leader = threading.Thread(target=post, args=("leader", {"url": "http://a.example/leader"}))
        leader.start()
        _wait_until(lambda: _lock_waiters(db_engine) == 1, "the leader waits for the fair-tag row")
        others = [
            threading.Thread(target=post, args=(f"job{i}", {"url": f"http://b.example/{i}"}))
            for i in range(6)
        ]
        others.append(
            threading.Thread(
                target=post,
                args=("same key, other body", {"url": "http://a.example/other"}),
                kwargs={"extra": {"Idempotency-Key": "k1"}},
            )
        )
        others.append(
            threading.Thread(
                target=post,
                args=("same key, same body", {"url": "http://a.example/keyed"}),
                kwargs={"extra": {"Idempotency-Key": "k1"}},
            )
        )
        for thread in others:
            thread.start()
        _wait_until(lambda: intake.waiting() == len(others), "every request waits")
        gate.rollback()
        for thread in [leader, *others]:
            thread.join(60)
    gate.close()
    gate_engine.dispose()

    # Two transactions: the leader's job alone, then the eight waiting together.
    assert counted["commit"] == 2, counted
    assert answers["leader"].status_code == 202
    for i in range(6):
        assert answers[f"job{i}"].status_code == 202, answers[f"job{i}"].text
    reused = answers["same key, other body"]
    assert reused.status_code == 422, reused.text
    assert reused.json()["errors"][0]["parameter"] == "Idempotency-Key"
    replayed = answers["same key, same body"]
    assert replayed.status_code == 202
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json()["id"] == keyed.json()["id"]
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM scraping.jobs")).scalar_one() == 9


def _lock_waiters(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()


def test_another_tenants_post_is_not_held_behind_a_tenants_write(
    client: TestClient, db_engine: Engine, db_url: str, make_tenant
) -> None:
    _, shop = make_tenant("shop")
    _, other = make_tenant("other")
    assert client.post("/jobs", json={"url": "http://a.example/0"}, headers=auth(shop)).is_success
    assert client.post("/jobs", json={"url": "http://a.example/1"}, headers=auth(other)).is_success

    gate_engine = create_engine(db_url)
    gate = gate_engine.connect()
    gate.execute(
        text(
            "SELECT 1 FROM scraping.tenant_vtimes v JOIN scraping.tenants t "
            "ON t.id = v.tenant_id WHERE t.name = 'shop' FOR UPDATE OF v"
        )
    ).all()
    answers: dict[str, Any] = {}

    def post(name: str, key: str) -> None:
        answers[name] = client.post(
            "/jobs", json={"url": f"http://a.example/{name}"}, headers=auth(key)
        )

    held = threading.Thread(target=post, args=("held", shop))
    free = threading.Thread(target=post, args=("free", other))
    try:
        held.start()
        _wait_until(lambda: _lock_waiters(db_engine) == 1, "shop's write waits for its row")
        free.start()
        free.join(120)
        # Written while shop's group still waits: tenants do not queue behind each other.
        assert "free" in answers, "another tenant's POST waited for shop's write"
        assert answers["free"].status_code == 202
        assert "held" not in answers
    finally:
        gate.rollback()
        held.join(60)
        free.join(60)
        gate.close()
        gate_engine.dispose()
    assert answers["held"].status_code == 202


def test_a_job_written_again_alone_is_answered_by_that_write_not_the_failed_groups(
    db_engine: Engine, db_url: str, local_store: Any, make_tenant
) -> None:
    """A group that fails is written again job by job: a job the group's intake limit
    refused (no tokens left after the others of the group) may be admitted alone, once the
    failed group's tokens are rolled back. Its answer is then its stored job (202), not the
    429 of the failed attempt: a client told "nothing was stored" would post it again."""
    # Stands for any failure of a job's insert (a deadlock victim, a constraint): the
    # group's transaction fails, its jobs are written alone.
    with db_engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION pg_temp_fail() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN IF NEW.url LIKE '%/fails-at-insert' THEN "
                "RAISE EXCEPTION 'this job fails at insert'; END IF; RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE TRIGGER fails_at_insert BEFORE INSERT ON scraping.jobs "
                "FOR EACH ROW EXECUTE FUNCTION pg_temp_fail()"
            )
        )
    _, key = make_tenant("shop")
    headers = auth(key)
    # Three tokens, none coming back during the test.
    with limited_client(db_engine, local_store, rps=0.0001, burst=3) as client:
        first = client.post("/jobs", json={"url": "http://a.example/first"}, headers=headers)
        assert first.status_code == 202  # makes the tenant's fair-tag row; 2 tokens left
        gate_engine = create_engine(db_url)
        gate = gate_engine.connect()
        gate.execute(text("SELECT 1 FROM scraping.tenant_vtimes FOR UPDATE")).all()
        answers: dict[str, Any] = {}

        def post(name: str, url: str) -> None:
            try:
                answers[name] = client.post("/jobs", json={"url": url}, headers=headers)
            except Exception as exc:  # the failing job's own answer (a 500)
                answers[name] = exc

        intake = client.app.state.intake  # type: ignore[attr-defined]
        threads = []
        try:
            leader = threading.Thread(target=post, args=("leader", "http://a.example/leader"))
            leader.start()  # takes a token (1 left), then waits for the fair-tag row
            threads.append(leader)
            _wait_until(lambda: _lock_waiters(db_engine) == 1, "the leader waits")
            # In this order: the group takes the last token for "bad", refuses "late".
            for name, url in [
                ("bad", "http://a.example/fails-at-insert"),
                ("late", "http://a.example/late"),
            ]:
                thread = threading.Thread(target=post, args=(name, url))
                thread.start()
                threads.append(thread)
                queued = len(threads) - 1
                _wait_until(lambda q=queued: intake.waiting() == q, f"{name} waits")
        finally:
            gate.rollback()
            for thread in threads:
                thread.join(60)
            gate.close()
            gate_engine.dispose()
    assert answers["leader"].status_code == 202
    with db_engine.connect() as conn:
        stored = conn.execute(
            text("SELECT id::text FROM scraping.jobs WHERE url = 'http://a.example/late'")
        ).all()
    late = answers["late"]
    # Alone, "late" took the token "bad" gave back: stored, and answered so.
    assert len(stored) == 1
    assert late.status_code == 202, late.text
    assert late.json()["id"] == stored[0][0]
