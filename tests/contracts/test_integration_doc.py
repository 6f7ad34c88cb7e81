"""docs/integration.md: its sql and python blocks run as written (the SQL as a raiser role
with EXECUTE only), its signature check agrees with an independent signer, and its table
lists cover every table the migrations create."""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from tests.contracts.test_raiser_functions import Raiser, raiser  # noqa: F401

DOC = Path(__file__).resolve().parents[2] / "docs" / "integration.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
UUID = re.compile(r"'([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})'")


def blocks(language: str) -> list[str]:
    return [
        body for lang, body in BLOCK.findall(DOC.read_text(encoding="utf-8")) if lang == language
    ]


def section(heading: str) -> str:
    doc = DOC.read_text(encoding="utf-8")
    start = doc.index(heading)
    following = doc.find("\n#", start + len(heading))
    return doc[start : following if following != -1 else len(doc)]


def test_the_doc_has_the_snippets_the_issue_asks_for() -> None:
    assert len(blocks("sql")) == 4 and len(blocks("python")) == 2
    assert len(blocks("csharp")) == 1


def test_sql_snippets_run_as_a_raiser(
    raiser: Raiser,  # noqa: F811
    db_engine: Engine,
) -> None:
    raise_recalc, raise_detach, submit_scraping, consumer_view = blocks("sql")
    [scraping_tenant] = set(UUID.findall(submit_scraping))
    with db_engine.begin() as conn:  # a tenant made with only the columns it must have
        conn.execute(
            text(
                "INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix) "
                "VALUES (:id, 'orders', '\\x00', 'pin_0000')"
            ),
            {"id": scraping_tenant},
        )
    connection = raiser.engine.raw_connection()
    try:
        connection.driver_connection.autocommit = True  # the snippets hold BEGIN / COMMIT
        with connection.driver_connection.cursor() as cursor:
            for snippet in (raise_recalc, raise_detach, submit_scraping, consumer_view):
                cursor.execute(snippet)
            cursor.execute("SELECT id::text, version, price_min FROM project_view")
            view = cursor.fetchall()
    finally:
        connection.close()

    project, tenant = UUID.findall(raise_recalc)
    snapshot, post = UUID.findall(raise_detach)
    with db_engine.connect() as conn:
        request = conn.execute(
            text(
                "SELECT tenant_id, last_reason, due_at - first_requested_at AS debounce "
                "FROM chessboard.project_recalc_requests WHERE project_id = :p"
            ),
            {"p": project},
        ).one()
        entry = conn.execute(
            text(
                "SELECT post_id, reason, status FROM news.snapshot_detach_outbox "
                "WHERE snapshot_id = :s"
            ),
            {"s": snapshot},
        ).one()
    assert (str(request.tenant_id), request.last_reason) == (tenant, "PropertyObjectPriceChanged")
    assert request.debounce.total_seconds() == 30
    assert (str(entry.post_id), entry.reason, entry.status) == (post, "BlockReplaced", "Pending")
    with db_engine.connect() as conn:
        jobs = conn.execute(
            text(
                "SELECT url, domain, priority, idempotency_key FROM scraping.jobs "
                "WHERE tenant_id = :t ORDER BY url"
            ),
            {"t": scraping_tenant},
        ).all()
    assert [tuple(j) for j in jobs] == [
        ("https://shop.example/products/42", "shop.example", "high", "order-42-product-page"),
        ("https://shop.example/products/43", "shop.example", "normal", None),
        ("https://shop.example/products/44", "shop.example", "normal", None),
    ]
    # The late version 2 did not overwrite version 3.
    assert [(i, v, str(p)) for i, v, p in view] == [(project, 3, "90.00")]


@pytest.fixture(scope="module")
def doc_python() -> dict[str, Any]:
    """The namespace the doc's python blocks leave (their own asserts run on the way)."""
    namespace: dict[str, Any] = {"__name__": "integration_doc"}
    for snippet in blocks("python"):
        exec(compile(snippet, str(DOC), "exec"), namespace)  # noqa: S102 - our own doc
    return namespace


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The sender's signature, written here independently of the doc."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def test_dedupe_snippet_applies_each_version_once(doc_python: dict[str, Any]) -> None:
    apply_upserted = doc_python["apply_upserted"]
    view: dict[str, dict] = {}
    entity = str(uuid.uuid4())
    applied = [
        apply_upserted(view, {"id": entity, "version": v, "snapshot": {"n": v}})
        for v in (1, 2, 2, 1, 4, 3)
    ]
    assert applied == [True, True, False, False, True, False]
    assert view[entity] == {"n": 4, "version": 4}


NOW = 1_767_225_600
SECRET = b"per-tenant-secret"
BODY = b'{"jobId":"0190a3c1-7c2e-7d41-9a55-2f0e6b1c9d05","status":"Succeeded"}\n'


@pytest.mark.parametrize(
    ("secret", "body", "timestamp", "signature", "accepted"),
    [
        (SECRET, BODY, str(NOW), sign(SECRET, str(NOW), BODY), True),
        (SECRET, BODY, str(NOW - 299), sign(SECRET, str(NOW - 299), BODY), True),
        (SECRET, BODY, str(NOW + 299), sign(SECRET, str(NOW + 299), BODY), True),
        (SECRET, BODY, str(NOW - 301), sign(SECRET, str(NOW - 301), BODY), False),  # stale
        (SECRET, BODY, str(NOW + 301), sign(SECRET, str(NOW + 301), BODY), False),  # future
        (SECRET, BODY + b" ", str(NOW), sign(SECRET, str(NOW), BODY), False),  # body changed
        (b"other-tenant", BODY, str(NOW), sign(SECRET, str(NOW), BODY), False),  # wrong secret
        # A captured delivery replayed with a fresh timestamp: the old signature fails.
        (SECRET, BODY, str(NOW), sign(SECRET, str(NOW - 3600), BODY), False),
        (SECRET, BODY, str(NOW), sign(SECRET, str(NOW), BODY).replace("sha256=", ""), False),
        (SECRET, BODY, str(NOW), sign(SECRET, str(NOW), BODY).upper(), False),
        (SECRET, BODY, None, sign(SECRET, str(NOW), BODY), False),
        (SECRET, BODY, str(NOW), None, False),
        (SECRET, BODY, "1767225600.0", sign(SECRET, "1767225600.0", BODY), False),
        (SECRET, BODY, "١٧٦٧٢٢٥٦٠٠", sign(SECRET, "1767225600", BODY), False),  # non-ASCII digits
    ],
)
def test_signature_snippet_accepts_exactly_fresh_deliveries_signed_with_the_secret(
    doc_python: dict[str, Any],
    secret: bytes,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    accepted: bool,
) -> None:
    verify = doc_python["verify_pin_signature"]
    assert verify(secret, body, timestamp, signature, now=NOW) is accepted


def test_every_table_is_listed_as_shared_or_private(db_engine: Engine) -> None:
    listed = {
        name: re.findall(r"^\| `(\w+\.\w+)` \|", section(heading), re.MULTILINE)
        for name, heading in (("shared", "### Shared tables"), ("private", "### Private tables"))
    }
    with db_engine.connect() as conn:
        tables = set(
            conn.execute(
                text(
                    "SELECT table_schema || '.' || table_name FROM information_schema.tables "
                    "WHERE table_type = 'BASE TABLE' "
                    "AND table_schema NOT IN ('pg_catalog', 'information_schema', 'public')"
                )
            ).scalars()
        )
    assert not set(listed["shared"]) & set(listed["private"])
    assert set(listed["shared"]) | set(listed["private"]) == tables, (
        "docs/integration.md must list every table as shared or private"
    )
