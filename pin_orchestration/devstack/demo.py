"""Demo data for the embedded default (`pin demo seed`): realistic rows with some drift.

Idempotent: ids are deterministic, rows are inserted with ON CONFLICT DO NOTHING, so a
second seed changes nothing (and does not undo what the jobs have since corrected).
"""

from __future__ import annotations

import hashlib
import random
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from pin_orchestration.news.snapshot_detach.monitoring import DEMO_ERROR_PREFIX
from pin_orchestration.platform.ids import uuid7
from pin_orchestration.scraping.store import repository, tenancy
from pin_orchestration.scraping.store.repository import JobRequest
from pin_orchestration.scraping.store.tenancy import Tenant

DEMO_POSTS = 200
_DEMO_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def seed_news(engine: Engine) -> dict[str, int]:
    """Posts with Visible/hidden/deleted comments; about one post in ten has a drifted counter."""
    rand = random.Random(20261130)
    now = datetime.now(UTC)
    posts: list[dict[str, object]] = []
    comments: list[dict[str, object]] = []
    for i in range(DEMO_POSTS):
        created = _DEMO_EPOCH + timedelta(hours=i * 7)
        post_id = uuid7(int(created.timestamp() * 1000), rand)
        status = rand.choices(["Published", "Unpublished", "Draft", "Archived"], [80, 8, 6, 6])[0]
        visible = 0
        # Half the posts had comments today (DailyWindow sees them), half only long ago.
        recent = i % 2 == 0
        for j in range(rand.randint(0, 15)):
            comment_status = rand.choices(
                ["Visible", "HiddenByModerator", "DeletedByAuthor"], [85, 8, 7]
            )[0]
            visible += comment_status == "Visible"
            at = (
                now - timedelta(hours=rand.uniform(0, 20))
                if recent
                else created + timedelta(hours=j)
            )
            comments.append(
                {
                    # ids derive from the post's fixed timeline, never from `now`, so a
                    # second seed finds the same ids.
                    "id": uuid7(int((created + timedelta(minutes=j)).timestamp() * 1000), rand),
                    "post_id": post_id,
                    "status": comment_status,
                    "body": f"demo comment {j} on post {i}",
                    "at": at,
                }
            )
        drifted = rand.random() < 0.1
        count = visible + rand.choice([-3, -2, -1, 1, 2, 4]) if drifted else visible
        posts.append(
            {
                "id": post_id,
                "status": status,
                "count": max(count, 0),
                "title": f"Demo post {i}",
                "at": created,
            }
        )
    with engine.begin() as conn:
        inserted_posts = conn.execute(
            text(
                """
                INSERT INTO news.posts (id, status, comments_count, title, created_at, updated_at)
                VALUES (:id, :status, :count, :title, :at, :at)
                ON CONFLICT (id) DO NOTHING
                """
            ),
            posts,
        ).rowcount
        inserted_comments = conn.execute(
            text(
                """
                INSERT INTO news.comments (id, post_id, status, body, created_at, updated_at)
                VALUES (:id, :post_id, :status, :body, :at, :at)
                ON CONFLICT (id) DO NOTHING
                """
            ),
            comments,
        ).rowcount
    return {"posts": inserted_posts, "comments": inserted_comments}


def seed_snapshot_detach_outbox(engine: Engine) -> dict[str, int]:
    """Detach intents: a dozen due now (the sensor launches a drain), two Quarantined (the
    no_quarantined_entries check shows red until `pin detach requeue` or the runbook job)."""
    rand = random.Random(20261201)
    rows = []
    for i in range(14):
        created = _DEMO_EPOCH + timedelta(minutes=i)
        quarantined = i >= 12
        rows.append(
            {
                "id": uuid7(int(created.timestamp() * 1000), rand),
                "snapshot_id": uuid.UUID(int=rand.getrandbits(128), version=4),
                "post_id": uuid7(int(created.timestamp() * 1000), rand),
                "reason": "PostDeleted" if i % 3 == 0 else "BlockReplaced",
                "status": "Quarantined" if quarantined else "Pending",
                "attempts": 12 if quarantined else 0,
                "last_error": (
                    f"{DEMO_ERROR_PREFIX}quarantined on purpose to show the "
                    "no_quarantined_entries alert (was transient:http_503); "
                    "`pin detach requeue ENTRY_ID` clears it"
                    if quarantined
                    else None
                ),
            }
        )
    with engine.begin() as conn:
        inserted = conn.execute(
            text(
                """
                INSERT INTO news.snapshot_detach_outbox
                    (id, snapshot_id, post_id, reason, status, attempts, last_error)
                VALUES (:id, :snapshot_id, :post_id, :reason, :status, :attempts, :last_error)
                ON CONFLICT DO NOTHING
                """
            ),
            rows,
        ).rowcount
    return {"snapshot_detach_outbox": inserted}


def seed_demo_data(engine: Engine) -> dict[str, dict[str, int]]:
    """Everything `pin demo seed` loads, per area."""
    from pin_orchestration.chessboard.sample import WorldShape, generate_world

    return {
        "news": seed_news(engine),
        "news_snapshot_detach": seed_snapshot_detach_outbox(engine),
        "chessboard": generate_world(engine, WorldShape(), prefix="demo"),
    }


# --- scraping: a tenant whose key `pin up` prints, and a few jobs against the local demo
# target site (one succeeds, one 404s, one retries on 503 then succeeds).

DEMO_TENANT = "demo"


def ensure_demo_tenant(engine: Engine, home: Path) -> tuple[Tenant, str]:
    """The demo tenant and its key, kept in $PIN_HOME/demo-api-key so restarts print the
    same key (a fresh home, or a key rotated elsewhere, gets a new one)."""
    key_file = home / "demo-api-key"
    if key_file.is_file():
        key = key_file.read_text().strip()
        with engine.connect() as conn:
            tenant = tenancy.tenant_for_api_key(conn, key)
        if tenant is not None:
            return tenant, key
    with engine.connect() as conn:
        exists = tenancy.tenant_by_name(conn, DEMO_TENANT) is not None
    if exists:
        tenant, key = tenancy.rotate_tenant_key(engine, DEMO_TENANT)
    else:
        tenant, key = tenancy.create_tenant(engine, DEMO_TENANT)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.touch(mode=0o600)
    key_file.write_text(key + "\n")
    return tenant, key


def submit_demo_jobs(engine: Engine, tenant_id: uuid.UUID, site_url: str) -> list[uuid.UUID]:
    """Idempotent per site: the same Idempotency-Keys make the same jobs again."""
    salt = hashlib.sha256(site_url.encode()).hexdigest()[:8]
    jobs = {
        "page": JobRequest(url=f"{site_url}/page/welcome", params={"lang": "en"}),
        "missing": JobRequest(url=f"{site_url}/missing/old-page", params={}),
        "flaky": JobRequest(url=f"{site_url}/flaky/busy-page", params={"fail": 2}, priority="high"),
    }
    return [
        repository.submit_job(engine, tenant_id, request, f"demo-{name}-{salt}").id
        for name, request in jobs.items()
    ]
