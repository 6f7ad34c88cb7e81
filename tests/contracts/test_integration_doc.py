"""docs/integration.md: its sql and python blocks run as written (the SQL as a raiser role
with EXECUTE only), its webhook verification (the standardwebhooks library) agrees with an
independent Standard Webhooks signer, and its table lists cover every table the
migrations create."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
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


def sign(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """A Standard Webhooks signature, written here independently of the doc and the
    service (the spec's "v1," + base64 HMAC-SHA256 of "<id>.<timestamp>.<body>")."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


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


SECRET = "whsec_" + base64.b64encode(b"per-tenant-secret-of-32-bytes!!!").decode()
OTHER = "whsec_" + base64.b64encode(b"another-tenant-secret-32-bytes!!").decode()
BODY = b'{"id":"0190a3c1-7c2e-7d41-9a55-2f0e6b1c9d05","status":"succeeded"}'
MSG = "msg_0190a3c17c2e7d419a552f0e6b1c9d05"


def headers(msg_id: str | None, timestamp: int | None, signature: str | None) -> dict[str, str]:
    named = {"webhook-id": msg_id, "webhook-timestamp": timestamp, "webhook-signature": signature}
    return {name: str(value) for name, value in named.items() if value is not None}


@pytest.mark.parametrize(
    ("secret", "body", "age", "signed_as", "accepted"),
    [
        (SECRET, BODY, 0, (SECRET, MSG, 0, BODY), True),
        (SECRET, BODY, 290, (SECRET, MSG, 290, BODY), True),
        (SECRET, BODY, -290, (SECRET, MSG, -290, BODY), True),
        (SECRET, BODY, 600, (SECRET, MSG, 600, BODY), False),  # stale
        (SECRET, BODY, -600, (SECRET, MSG, -600, BODY), False),  # from the future
        (SECRET, BODY + b" ", 0, (SECRET, MSG, 0, BODY), False),  # body changed
        (OTHER, BODY, 0, (SECRET, MSG, 0, BODY), False),  # another tenant's secret
        # A captured delivery replayed with a fresh timestamp: the old signature fails.
        (SECRET, BODY, 0, (SECRET, MSG, 3600, BODY), False),
        # Another event's id on this body: the id is signed too.
        (SECRET, BODY, 0, (SECRET, "msg_other", 0, BODY), False),
    ],
)
def test_the_docs_verification_accepts_exactly_fresh_deliveries_signed_with_the_secret(
    doc_python: dict[str, Any],
    secret: str,
    body: bytes,
    age: int,
    signed_as: tuple[str, str, int, bytes],
    accepted: bool,
) -> None:
    now = int(time.time())
    signing_secret, msg_id, signed_age, signed_body = signed_as
    signature = sign(signing_secret, msg_id, str(now - signed_age), signed_body)
    event = doc_python["verified_event"](secret, body, headers(MSG, now - age, signature))
    assert (event is not None) is accepted


def test_during_a_rotation_either_secret_verifies_and_a_retired_one_does_not(
    doc_python: dict[str, Any],
) -> None:
    verified_event = doc_python["verified_event"]
    now = int(time.time())
    both = " ".join(sign(s, MSG, str(now), BODY) for s in (SECRET, OTHER))
    assert verified_event(SECRET, BODY, headers(MSG, now, both)) is not None
    assert verified_event(OTHER, BODY, headers(MSG, now, both)) is not None
    only_new = sign(SECRET, MSG, str(now), BODY)
    assert verified_event(OTHER, BODY, headers(MSG, now, only_new)) is None


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_delivery_without_a_signing_header_is_refused(
    doc_python: dict[str, Any], missing: str
) -> None:
    now = int(time.time())
    sent = headers(MSG, now, sign(SECRET, MSG, str(now), BODY))
    del sent[missing]
    assert doc_python["verified_event"](SECRET, BODY, sent) is None


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
