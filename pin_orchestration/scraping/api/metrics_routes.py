"""GET /metrics for the bearer of PIN_METRICS_TOKEN: the scraping metrics (the same as
`pin metrics serve`'s) and this process's read-cache counters. The gauges read from
PostgreSQL are computed at most once per PIN_METRICS_CACHE_SECONDS. Not in the OpenAPI
document: it is the operators', not the tenants'.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations.

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse, Response

from pin_orchestration.scraping.api.deps import ApiDeps


def metrics_router(deps: ApiDeps, token: str) -> APIRouter:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from pin_orchestration.scraping.metrics import JobCacheCollector, ScrapingCollector

    router = APIRouter(include_in_schema=False)
    expected = f"Bearer {token}".encode()
    collectors: list[Any] = []

    def registry() -> CollectorRegistry:
        if not collectors:  # the engine exists once the app has started
            collectors.append(
                ScrapingCollector(
                    deps.engine_provider(), cache_seconds=deps.settings.metrics_cache_seconds
                )
            )
            if deps.job_cache is not None:
                collectors.append(JobCacheCollector(deps.job_cache))
        built = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            built.register(collector)
        return built

    @router.get("/metrics")
    def metrics(authorization: Annotated[str | None, Header()] = None) -> Response:
        given = (authorization or "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            return JSONResponse(
                {"detail": "/metrics wants the operators' token (PIN_METRICS_TOKEN) as a bearer"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return Response(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)

    return router
