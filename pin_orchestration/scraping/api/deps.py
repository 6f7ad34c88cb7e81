"""What every router of the API shares, built once per app by `create_app`: the engine,
the results store, the settings, the read cache, the intake limit and the tenant behind
the request's API key (`Caller`), with the error answers every authenticated operation
documents. Endpoints are plain functions of their module's router: they find their app's
`ApiDeps` on the request (`Deps`), where `create_app` put it.
"""

# No `from __future__ import annotations`: FastAPI reads the dependency's annotations.

import hmac
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection, Engine

from pin_orchestration.scraping.api.cache import JobCache
from pin_orchestration.scraping.api.intake import GroupedIntake
from pin_orchestration.scraping.api.limits import MAX_HEADER_BYTES
from pin_orchestration.scraping.api.problems import Problem
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store import repository, tenancy
from pin_orchestration.scraping.store.results import ResultStore
from pin_orchestration.scraping.store.tenancy import Tenant

# Documented by every operation that takes an API key.
UNAUTHORIZED = {401: {"model": Problem, "description": "Missing or wrong API key"}}
HEADERS_TOO_LARGE = {
    431: {
        "model": Problem,
        "description": f"The request's headers exceed {MAX_HEADER_BYTES} bytes in all",
    }
}

# How long an API key stays known to an API process after a lookup: a rotated key keeps
# working at most this long (documented in docs/jobs/scraping.md, `pin tenant rotate-key`).
API_KEY_CACHE_SECONDS = 10.0


class ApiKeyCache:
    """API key → tenant for a few seconds, in this process. Only keys that matched are
    kept (an unknown key always asks PostgreSQL), keyed by the key's sha256, at most
    `max_entries` of them."""

    def __init__(self, ttl_seconds: float, max_entries: int = 10_000) -> None:
        self._ttl = ttl_seconds
        self._max_entries = max_entries
        self._entries: dict[bytes, tuple[bytes, Tenant, float]] = {}
        self._lock = threading.Lock()

    def get(self, api_key: str) -> Tenant | None:
        if self._ttl <= 0:
            return None
        # Keyed by digest, like the database (tenancy.tenant_for_api_key says why that
        # is safe); the entry's own digest is compared in constant time.
        digest = tenancy.api_key_digest(api_key)
        entry = self._entries.get(digest)
        if entry is None or entry[2] < time.monotonic():
            return None
        if not hmac.compare_digest(entry[0], digest):
            return None
        return entry[1]

    def put(self, api_key: str, tenant: Tenant) -> None:
        if self._ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            digest = tenancy.api_key_digest(api_key)
            self._entries[digest] = (digest, tenant, time.monotonic() + self._ttl)


_bearer = HTTPBearer(auto_error=False)


class ApiDeps:
    """One app's dependencies, `app.state.deps`. Endpoints declare `deps: Deps` for it and
    `caller: Caller` for the tenant of the request's API key (a 401 without one)."""

    def __init__(
        self,
        engine_provider: Callable[[], Engine],
        store: ResultStore,
        settings: ScrapingSettings,
        *,
        api_key_cache_seconds: float = API_KEY_CACHE_SECONDS,
    ) -> None:
        self.engine_provider = engine_provider
        self.store = store
        self.settings = settings
        self.job_cache = (
            JobCache.from_url(
                settings.redis_url,
                retention_seconds=settings.result_retention_days * 86400,
                terminal_ttl_seconds=settings.cache_terminal_ttl_seconds,
            )
            if settings.redis_url
            else None
        )
        self.intake_limit = repository.IntakeLimit(
            rps=settings.intake_rps, burst=settings.intake_burst
        )
        # POST /jobs' writer: one per app, so concurrent requests share its groups.
        self.intake = GroupedIntake(engine_provider, self.intake_limit)
        self._known_keys = ApiKeyCache(api_key_cache_seconds)

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        # Reads need no transaction: autocommit spares the BEGIN/ROLLBACK round trip.
        with self.engine_provider().connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def _look_up_key(self, api_key: str) -> Tenant | None:
        with self.reading() as conn:
            return tenancy.tenant_for_api_key(conn, api_key)

    # async: a key seen in the last seconds is answered on the event loop, without a
    # thread hop or a query; only a miss goes to PostgreSQL (in the thread pool).
    async def tenant(self, credentials: HTTPAuthorizationCredentials | None) -> Tenant:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise HTTPException(
                401, "Authorization: Bearer <API key> required", {"WWW-Authenticate": "Bearer"}
            )
        found = self._known_keys.get(credentials.credentials)
        if found is None:
            found = await run_in_threadpool(self._look_up_key, credentials.credentials)
            if found is None:
                raise HTTPException(401, "unknown API key", {"WWW-Authenticate": "Bearer"})
            self._known_keys.put(credentials.credentials, found)
        return found


# async, as the dependencies below: resolved on the event loop, without a thread hop.
async def _app_deps(request: Request) -> ApiDeps:
    deps: ApiDeps = request.app.state.deps
    return deps


Deps = Annotated[ApiDeps, Depends(_app_deps)]


async def _caller(
    deps: Deps,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    return await deps.tenant(credentials)


Caller = Annotated[Tenant, Depends(_caller)]
