"""The tenants of the scraping service: their names, API keys (kept as digests) and fair-share
weights, as `pin tenant` manages them and the API authenticates them."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from pin_orchestration.platform.ids import uuid7
from pin_orchestration.platform.sql import NamedQueries

_q = NamedQueries("pin_orchestration.scraping", "queries.sql")


@dataclass(frozen=True)
class Tenant:
    id: uuid.UUID
    name: str


class TenantError(ValueError):
    """A tenant command that cannot be carried out (name taken, unknown, malformed)."""


def _new_api_key() -> tuple[str, bytes, str]:
    key = "pin_" + secrets.token_urlsafe(32)
    return key, api_key_digest(key), key[:8]


def create_tenant(engine: Engine, name: str) -> tuple[Tenant, str]:
    """A new tenant and its API key — the only time the key is seen; only its hash is kept."""
    key, digest, prefix = _new_api_key()
    with engine.begin() as conn:
        try:
            row = conn.execute(
                _q("create_tenant"),
                {"id": uuid7(), "name": name, "api_key_sha256": digest, "api_key_prefix": prefix},
            ).one_or_none()
        except Exception as exc:  # the CHECK on the name
            if "tenants_name_check" in str(exc):
                raise TenantError(
                    f"tenant name {name!r} is invalid: use 1-63 letters, digits, '_', '.', '-'"
                ) from None
            raise
    if row is None:
        raise TenantError(f"tenant {name!r} exists already (rotate its key: pin tenant rotate-key)")
    return Tenant(row.id, row.name), key


def rotate_tenant_key(engine: Engine, name: str) -> tuple[Tenant, str]:
    key, digest, prefix = _new_api_key()
    with engine.begin() as conn:
        row = conn.execute(
            _q("rotate_tenant_key"),
            {"name": name, "api_key_sha256": digest, "api_key_prefix": prefix},
        ).one_or_none()
    if row is None:
        raise TenantError(f"no tenant {name!r} (pin tenant list shows them)")
    return Tenant(row.id, row.name), key


def list_tenants(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(_q("list_tenants"))]


def api_key_digest(api_key: str) -> bytes:
    """What is stored of a key (and what an API process remembers it by)."""
    return hashlib.sha256(api_key.encode()).digest()


def tenant_for_api_key(conn: Connection, api_key: str) -> Tenant | None:
    """The tenant whose key this is. Only the key's sha256 is ever compared, never the key:
    the index lookup's timing can tell an attacker at most how many leading bytes of a
    *digest* matched, which does not help find a key whose digest matches more (a
    preimage); the final comparison is constant-time all the same."""
    digest = api_key_digest(api_key)
    row = conn.execute(_q("tenant_by_key"), {"api_key_sha256": digest}).one_or_none()
    if row is None or not hmac.compare_digest(bytes(row.api_key_sha256), digest):
        return None
    return Tenant(row.id, row.name)


def tenant_by_name(conn: Connection, name: str) -> Tenant | None:
    row = conn.execute(_q("tenant_by_name"), {"name": name}).one_or_none()
    return Tenant(row.id, row.name) if row else None


# The bounds of scraping.tenants.weight (0044). The floor keeps start tags, which grow by
# 1/weight a job, far inside a double's exact range: below it, one tenant's picks pushed
# the class clock where the others' steps were lost.
MIN_TENANT_WEIGHT = 0.001
MAX_TENANT_WEIGHT = 1000.0


def set_tenant_weight(engine: Engine, name: str, weight: float) -> Tenant:
    """A tenant's share of the picks inside each priority class (default 1: a tenant of
    weight 2 starts twice as many jobs as one of weight 1 while both have work)."""
    if not MIN_TENANT_WEIGHT <= weight <= MAX_TENANT_WEIGHT:
        raise TenantError(
            f"weight must be between {MIN_TENANT_WEIGHT:g} and {MAX_TENANT_WEIGHT:g} "
            f"(got {weight!r}): it is the tenant's share beside weight 1, e.g. "
            f"`pin tenant set-weight {name} 0.5` for half"
        )
    with engine.begin() as conn:
        row = conn.execute(_q("set_tenant_weight"), {"name": name, "weight": weight}).one_or_none()
    if row is None:
        raise TenantError(f"no tenant {name!r} (pin tenant list shows them)")
    return Tenant(row.id, row.name)
