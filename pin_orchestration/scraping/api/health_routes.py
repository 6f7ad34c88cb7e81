"""The API's probes (docs/deploy.md): `/healthz` for liveness — the process serves
requests — and `/readyz` for readiness — PostgreSQL, which every endpoint needs, answers.

Liveness never touches the database: a database outage must take the API out of the load
balancer (readiness), not make Kubernetes restart every replica.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError


def health_router(engine_provider: Callable[[], Engine]) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    # async: answered on the event loop, even while every worker thread is busy.
    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz", response_model=None)
    def readyz() -> dict[str, str] | JSONResponse:
        engine = engine_provider()
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            where = engine.url.render_as_string(hide_password=True)
            cause = type(getattr(exc, "orig", None) or exc).__name__
            return JSONResponse(
                {"detail": f"database unreachable ({where}): {cause}"}, status_code=503
            )
        return {"status": "ready"}

    return router
