"""The scraping API (SCR-1, SCR-2; FastAPI), assembled: one router per resource — jobs
(`jobs_routes`), batch intake (`batch_routes`), results downloads (`store_routes`),
metrics (`metrics_routes`), probes (`health_routes`) — over the dependencies they share
(`deps`), every error answered as an RFC 9457 problem (`problems`).
"""

import gc
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import Response
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine

from pin_orchestration.scraping.api import problems
from pin_orchestration.scraping.api.batch_routes import batch_router
from pin_orchestration.scraping.api.cache import InvalidationListener
from pin_orchestration.scraping.api.deps import (
    API_KEY_CACHE_SECONDS,
    HEADERS_TOO_LARGE,
    UNAUTHORIZED,
    ApiDeps,
)
from pin_orchestration.scraping.api.health_routes import health_router
from pin_orchestration.scraping.api.job_models import MAX_PARAMS_DEPTH
from pin_orchestration.scraping.api.jobs_routes import jobs_router
from pin_orchestration.scraping.api.limits import MAX_BATCH_BODY_BYTES, RequestSizeLimits
from pin_orchestration.scraping.api.metrics_routes import metrics_router
from pin_orchestration.scraping.api.problems import FieldError
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store.repository import IDEMPOTENCY_KEY_TTL_SECONDS
from pin_orchestration.scraping.store.results import ResultStore


def create_app(
    engine_provider: Callable[[], Engine],
    store: ResultStore,
    settings: ScrapingSettings | None = None,
    *,
    listen_for_invalidations: bool = True,
    api_key_cache_seconds: float = API_KEY_CACHE_SECONDS,
) -> FastAPI:
    """The API. With `settings.redis_url`, `GET /jobs/{id}` is served through the read
    cache, invalidated by a listener thread running for the app's lifetime
    (`listen_for_invalidations=False` leaves only the TTLs, for tests of that bound)."""
    deps = ApiDeps(
        engine_provider,
        store,
        settings or ScrapingSettings.from_env(),
        api_key_cache_seconds=api_key_cache_seconds,
    )
    # /docs and /redoc from the Swagger UI and ReDoc files in fastapi-offline: no CDN.
    app = FastAPIOffline(
        title="pin-orchestration scraping API",
        version="1",
        description="Submit URLs to fetch, poll their status, download results through "
        "signed URLs. Auth: `Authorization: Bearer <tenant API key>`. An Idempotency-Key "
        f"is remembered for {IDEMPOTENCY_KEY_TTL_SECONDS // 3600} h.",
        lifespan=_lifespan(deps, listen_for_invalidations),
    )
    app.state.deps = deps
    app.state.job_cache = deps.job_cache
    app.state.intake = deps.intake

    # Before the job routes: /jobs/batch is not a job id.
    app.include_router(batch_router, responses={**UNAUTHORIZED, **HEADERS_TOO_LARGE})
    app.include_router(jobs_router)
    if deps.settings.metrics_token is not None:
        app.include_router(metrics_router(deps, deps.settings.metrics_token))
    app.include_router(health_router(engine_provider))
    _mount_local_results(app, store)

    problems.install(app)
    _answer_405_with_every_allowed_method(app)
    _answer_too_deep_json_with_422(app)
    app.add_middleware(RequestSizeLimits, body_bytes_by_path={"/jobs/batch": MAX_BATCH_BODY_BYTES})
    return app


def _lifespan(
    deps: ApiDeps, listen_for_invalidations: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """With the read cache, its invalidation listener runs for the app's lifetime."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        listener = None
        if deps.job_cache is not None and listen_for_invalidations:
            url = deps.engine_provider().url.set(drivername="postgresql")
            listener = InvalidationListener(
                url.render_as_string(hide_password=False), deps.job_cache
            )
            listener.start()
        try:
            yield
        finally:
            if listener is not None:
                listener.stop()

    return lifespan


def _answer_405_with_every_allowed_method(app: FastAPI) -> None:
    """Starlette's 405 lists only the methods of the first route whose path matched; a path
    served by several routes (GET and POST /jobs) must list them all (RFC 9110 §15.5.6):
    the routes of the first path template that matched (/jobs/batch, not /jobs/{job_id}),
    the documented ones where there are (not the route that refuses GET /jobs/batch). A
    405 an endpoint raised itself (a full match: GET /jobs/batch) keeps its own Allow."""
    from fastapi.routing import iter_route_contexts
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request
    from starlette.routing import Match

    def allowed_methods(request: Request) -> str | None:
        # Every route, those of included routers too (FastAPI ≥ 0.165 keeps them behind
        # one entry per router in app.router.routes), in the order they are tried.
        matched = []
        for route in iter_route_contexts(app.router.routes):
            match, _ = route.matches(request.scope)
            if match == Match.FULL:
                return None
            if match == Match.PARTIAL:
                matched.append(route)
        if not matched:
            return None
        same_path = [route for route in matched if route.path == matched[0].path]
        documented = [route for route in same_path if route.include_in_schema] or same_path
        return ", ".join(sorted({m for route in documented for m in route.methods or ()}))

    async def handler(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405 and (allowed := allowed_methods(request)) is not None:
            exc.headers = {**(exc.headers or {}), "Allow": allowed}
        return await problems.http_problem(request, exc)

    app.add_exception_handler(StarletteHTTPException, handler)  # type: ignore[arg-type]


def _answer_too_deep_json_with_422(app: FastAPI) -> None:
    """The 400 of a body nested past the JSON parser's depth becomes the 422 it is. (After
    problems.install: the handler it wraps answers every other HTTP error as a problem.)"""
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request

    http_errors = app.exception_handlers[StarletteHTTPException]

    async def unparsable(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            detail = (
                f"the JSON body is nested too deeply (params: at most {MAX_PARAMS_DEPTH} levels)"
            )
            return problems.problem_response(
                422,
                detail,
                type_=problems.VALIDATION,
                title="The request is invalid",
                instance=request.url.path,
                errors=[FieldError(pointer="", detail=detail)],
            )
        return await http_errors(request, exc)

    app.add_exception_handler(StarletteHTTPException, unparsable)  # type: ignore[arg-type]


def _mount_local_results(app: FastAPI, store: ResultStore) -> None:
    from pin_orchestration.scraping.store.local import LocalResultStore

    if isinstance(store, LocalResultStore):
        from pin_orchestration.scraping.api.store_routes import local_results_router

        app.include_router(local_results_router(store))


def app_from_env() -> FastAPI:
    """The app as `pin api` serves it: database and results store from the environment."""
    from pin_orchestration.platform.db import create_db_engine, resolve_database_url
    from pin_orchestration.scraping.store.local import result_store_from

    settings = ScrapingSettings.from_env()
    url = resolve_database_url()
    app = create_app(lambda: create_db_engine(url), result_store_from(settings), settings)
    # What the process holds by now (~180k objects: the modules `pin` imports, the app)
    # lives as long as it does: frozen, the collector's full passes no longer walk it. Each
    # such pass stopped the event loop for 0.1-0.7 s, every few seconds under load.
    gc.freeze()
    return app
