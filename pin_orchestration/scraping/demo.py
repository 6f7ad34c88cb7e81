"""The scraping part of the demo: a tenant whose key `pin up` prints, and a few jobs
against the local demo site (one succeeds, one 404s, one retries on 503 then succeeds)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

from sqlalchemy import Engine

from pin_orchestration.scraping import repository
from pin_orchestration.scraping.repository import JobRequest, Tenant

DEMO_TENANT = "demo"


def ensure_demo_tenant(engine: Engine, home: Path) -> tuple[Tenant, str]:
    """The demo tenant and its key, kept in $PIN_HOME/demo-api-key so restarts print the
    same key (a fresh home, or a key rotated elsewhere, gets a new one)."""
    key_file = home / "demo-api-key"
    if key_file.is_file():
        key = key_file.read_text().strip()
        with engine.connect() as conn:
            tenant = repository.tenant_for_api_key(conn, key)
        if tenant is not None:
            return tenant, key
    with engine.connect() as conn:
        exists = repository.tenant_by_name(conn, DEMO_TENANT) is not None
    if exists:
        tenant, key = repository.rotate_tenant_key(engine, DEMO_TENANT)
    else:
        tenant, key = repository.create_tenant(engine, DEMO_TENANT)
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
