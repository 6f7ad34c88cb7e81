"""The scraping intake and query API (SCR-1, SCR-2; FastAPI).

Intake writes one row in one transaction and answers 202 with a receipt: it never touches
the target. Queries return only the caller's own jobs — another tenant's id is a 404, not
a 403, so ids leak nothing. Result bytes never pass through the API: `/jobs/{id}/result`
hands out a signed, expiring URL of the results store.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations,
# some of them local to create_app, at definition time.

import hmac
import json
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Path, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
)
from sqlalchemy import Connection, Engine

from pin_orchestration.scraping import problems, ratelimit, repository, signing, webhooks
from pin_orchestration.scraping.cache import InvalidationListener, JobCache
from pin_orchestration.scraping.health_routes import health_router
from pin_orchestration.scraping.limits import (
    MAX_BATCH_BODY_BYTES,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    RequestSizeLimits,
)
from pin_orchestration.scraping.problems import FieldError, Problem, ProblemError
from pin_orchestration.scraping.ratelimit import RateLimited
from pin_orchestration.scraping.repository import (
    IDEMPOTENCY_KEY_TTL_SECONDS,
    TERMINAL,
    IdempotencyKeyReused,
    JobRequest,
    Tenant,
)
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store import ResultStore

MAX_URL_LENGTH = 2048
MAX_PARAMS_BYTES = 16 * 1024
# Levels of arrays and objects inside `params` (a job's query parameters are flat; this
# bounds the work of checking and storing them).
MAX_PARAMS_DEPTH = 32
# What the schema can say of a URL (scheme, a host, no whitespace); _check_url says the rest.
URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s/?#]+([/?#]\S*)?$"

UtcDatetime = Annotated[
    datetime,
    PlainSerializer(lambda d: d.astimezone(UTC).isoformat(), return_type=str),
    # Still a date-time in the schema (the serializer alone makes it a plain string), so
    # generated clients parse it as one.
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


def _has_lone_surrogate(value: str) -> bool:
    """JSON's \\ud800 escapes decode to code points UTF-8 (and PostgreSQL) cannot hold."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_url(value: str, field: str) -> str:
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"{field} is longer than {MAX_URL_LENGTH} characters")
    if "\x00" in value or any(c.isspace() for c in value):
        raise ValueError(f"{field} must not contain whitespace or NUL characters")
    if _has_lone_surrogate(value):
        raise ValueError(
            f"{field} contains a lone UTF-16 surrogate (such as \\ud800), which is not text: "
            "percent-encode the bytes you mean"
        )
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{field} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{field} must be an http:// or https:// URL")
    if "@" in parts.netloc:
        # They would be stored and shown in every read of the job (and sent on redirects).
        raise ValueError(
            f"{field}: credentials in a URL are not accepted (remove the user:password@ part)"
        )
    if not parts.hostname:
        raise ValueError(f"{field} has no host")
    if port == 0:
        raise ValueError(f"{field} has port 0")
    try:
        repository.job_domain(value)  # the domain its politeness limits count against
    except ValueError as exc:
        raise ValueError(f"{field} has a host that is not a valid name: {exc}") from None
    return value


def _check_json_value(value: Any, path: str) -> None:
    """PostgreSQL's jsonb refuses NUL characters and lone surrogates, and JSON has no
    NaN/Infinity (Python's parser reads them, and 1e400, as floats): say so as a 422
    naming the place instead of failing at insert. Walked without recursion, to a bounded
    depth."""
    pending: list[tuple[Any, str, int]] = [(value, path, 0)]
    while pending:
        item, where, depth = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError(f"{where} contains a NUL character")
            if _has_lone_surrogate(item):
                raise ValueError(f"{where} contains a lone UTF-16 surrogate (such as \\ud800)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(
                    f"{where} is not a finite number (NaN, Infinity and numbers beyond "
                    "double precision have no JSON value)"
                )
        elif isinstance(item, dict | list):
            if depth >= MAX_PARAMS_DEPTH:
                raise ValueError(f"{where} is nested deeper than {MAX_PARAMS_DEPTH} levels")
            if isinstance(item, dict):
                for k, v in item.items():
                    if "\x00" in k:
                        raise ValueError(f"{where} has a key containing a NUL character")
                    if _has_lone_surrogate(k):
                        raise ValueError(
                            f"{where} has a key containing a lone UTF-16 surrogate (such as "
                            "\\ud800)"
                        )
                    pending.append((v, f"{where}.{k}", depth + 1))
            else:
                pending.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))


# The pattern is documented, not enforced: _check_url says what is wrong in words, naming
# the field (a failed pattern would answer with the raw regular expression).
UrlText = Annotated[
    str, Field(max_length=MAX_URL_LENGTH, json_schema_extra={"pattern": URL_PATTERN})
]


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: UrlText = Field(
        description="The http(s) URL to fetch",
        examples=["https://example.com/page"],
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Query parameters added to the URL (JSON object, at most 16 KiB)",
    )
    priority: Literal["high", "normal", "low"] = "normal"
    callback_url: UrlText | None = Field(
        default=None,
        description="Optional http(s) URL told when the job finishes",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value, "url")

    @field_validator("callback_url")
    @classmethod
    def _callback_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value, "callback_url")

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_json_value(value, "params")
        size = len(json.dumps(value, separators=(",", ":")).encode())
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"params is {size} bytes as JSON; at most {MAX_PARAMS_BYTES}")
        return value


class Links(BaseModel):
    self: str


class Receipt(BaseModel):
    id: uuid.UUID
    status: str
    links: Links


class ResultInfo(BaseModel):
    size: int
    sha256: str
    content_type: str | None
    links: dict[str, str]


class JobView(BaseModel):
    id: uuid.UUID
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    url: str
    params: dict[str, Any]
    priority: str
    callback_url: str | None
    attempts: int
    last_error: str | None
    last_error_class: str | None
    next_attempt_at: UtcDatetime | None
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    result: ResultInfo | None


class JobList(BaseModel):
    items: list[JobView]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end"
    )


class ResultLink(BaseModel):
    url: str = Field(description="A signed URL of the stored result; GET it before expires_at")
    expires_at: UtcDatetime


class AttemptView(BaseModel):
    number: int
    started_at: UtcDatetime
    finished_at: UtcDatetime | None
    outcome: str | None = Field(description="succeeded|retry|failed|lost|cancelled; null in flight")
    http_status: int | None
    error_class: str | None
    error_detail: str | None
    duration_ms: int | None


class AttemptList(BaseModel):
    items: list[AttemptView]


class CancelAnswer(BaseModel):
    id: uuid.UUID
    status: str = Field(description="cancelled, or running while the worker finishes its check")
    cancel_requested: bool


# How long an API key stays known to an API process after a lookup: a rotated key keeps
# working at most this long (documented in README, `pin tenant rotate-key`).
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
        # Keyed by digest, like the database (repository.tenant_for_api_key says why that
        # is safe); the entry's own digest is compared in constant time.
        digest = repository.api_key_digest(api_key)
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
            digest = repository.api_key_digest(api_key)
            self._entries[digest] = (digest, tenant, time.monotonic() + self._ttl)


class DeliveryView(BaseModel):
    number: int = Field(description="Attempt number of this announcement, from 1")
    job_status: str = Field(description="The status the delivery announced")
    attempted_at: UtcDatetime
    url: str
    outcome: Literal["delivered", "retry", "gave_up"] = Field(
        description="delivered: a 2xx answer; retry: sent again at next_attempt_at; "
        "gave_up: the last attempt (the cap reached, or the address is refused)"
    )
    http_status: int | None
    error_class: str | None = Field(
        description="http_<status>, timeout, connection_error, refused_address, …"
    )
    error_detail: str | None
    duration_ms: int
    next_attempt_at: UtcDatetime | None


class DeliveryList(BaseModel):
    items: list[DeliveryView]


class WebhookEvent(BaseModel):
    """The body of a completion webhook (its raw bytes are what is signed)."""

    id: uuid.UUID
    status: Literal["succeeded", "failed", "cancelled"]
    finished_at: UtcDatetime


def _webhook_callbacks() -> APIRouter:
    """The completion webhook as an OpenAPI callback of POST /jobs: body and headers."""
    callbacks = APIRouter()

    @callbacks.post(
        "{$request.body#/callback_url}",
        status_code=204,
        summary="Completion webhook: the job finished",
        description="Sent when a job with a callback_url finishes (succeeded, failed or "
        "cancelled), at least once: answer 2xx to acknowledge; anything else, a timeout "
        "or no connection is retried with exponential backoff and jitter "
        "(PIN_WEBHOOK_MAX_ATTEMPTS, default 8, attempts in all). Every attempt is listed "
        "at GET /jobs/{id}/deliveries. Polling GET /jobs/{id} stays the primary channel. "
        "Signed as Standard Webhooks 1.0: verify with the `standardwebhooks` or `svix` "
        "libraries and the tenant's `whsec_` secret (`pin tenant webhook-secret NAME`; "
        "docs/integration.md), which refuse timestamps more than 5 minutes off.",
    )
    def completion_webhook(
        body: WebhookEvent,
        webhook_id: Annotated[
            str,
            Header(
                alias=signing.ID_HEADER,
                description="The event's id, the same on every retry: de-duplicate by it",
            ),
        ],
        webhook_timestamp: Annotated[
            str, Header(alias=signing.TIMESTAMP_HEADER, description="Unix seconds, signed")
        ],
        webhook_signature: Annotated[
            str,
            Header(
                alias=signing.SIGNATURE_HEADER,
                description="v1,<base64 HMAC-SHA256 of '<webhook-id>.<webhook-timestamp>."
                "<raw body>'>; during a secret rotation two, space-separated",
            ),
        ],
    ) -> None:
        """Documentation only: the receiver is the client's."""

    return callbacks


UNAUTHORIZED = {401: {"model": Problem, "description": "Missing or wrong API key"}}
NOT_FOUND = {404: {"model": Problem, "description": "No such job for this tenant"}}
CONFLICT = {409: {"model": Problem, "description": "Not possible in the job's current status"}}


def _job_links(*names: str) -> dict[str, Any]:
    """OpenAPI links from an answer naming a job (its `id`) to the operations on that job:
    clients and tools (schemathesis's stateful runs) follow them."""
    operations = {
        "GetJob": "read_job_jobs__job_id__get",
        "CancelJob": "cancel_jobs__job_id__cancel_post",
        "GetAttempts": "attempts_jobs__job_id__attempts_get",
        "GetResult": "result_link_jobs__job_id__result_get",
        "GetDeliveries": "deliveries_jobs__job_id__deliveries_get",
    }
    return {
        name: {
            "operationId": operations[name],
            "parameters": {"job_id": "$response.body#/id"},
        }
        for name in names
    }


HEADERS_TOO_LARGE = {
    431: {
        "model": Problem,
        "description": f"The request's headers exceed {MAX_HEADER_BYTES} bytes in all",
    }
}
BODY_TOO_LARGE = {
    413: {"model": Problem, "description": f"The request body exceeds {MAX_BODY_BYTES} bytes"}
}
RATE_LIMITED = {
    429: {
        "model": RateLimited,
        "description": "The tenant's intake rate limit is reached (a token bucket shared by "
        "every API process: PIN_SCRAPING_INTAKE_RPS jobs/s, PIN_SCRAPING_INTAKE_BURST at "
        "once). Nothing was stored; retry after Retry-After. A repeat of an accepted "
        "request (same Idempotency-Key, same body) is answered 202 even then.",
        "headers": {
            "Retry-After": {
                "description": "Seconds to wait before the next POST /jobs (an integer ≥ 1)",
                "required": True,
                "schema": {"type": "integer", "minimum": 1},
            },
            **ratelimit.OPENAPI_HEADERS,
        },
    }
}


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
    settings = settings or ScrapingSettings.from_env()
    job_cache = (
        JobCache.from_url(
            settings.redis_url,
            retention_seconds=settings.result_retention_days * 86400,
            terminal_ttl_seconds=settings.cache_terminal_ttl_seconds,
        )
        if settings.redis_url
        else None
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        listener = None
        if job_cache is not None and listen_for_invalidations:
            url = engine_provider().url.set(drivername="postgresql")
            listener = InvalidationListener(url.render_as_string(hide_password=False), job_cache)
            listener.start()
        try:
            yield
        finally:
            if listener is not None:
                listener.stop()

    # /docs and /redoc from the Swagger UI and ReDoc files in fastapi-offline: no CDN.
    app = FastAPIOffline(
        title="pin-orchestration scraping API",
        version="1",
        description="Submit URLs to fetch, poll their status, download results through "
        "signed URLs. Auth: `Authorization: Bearer <tenant API key>`. An Idempotency-Key "
        f"is remembered for {IDEMPOTENCY_KEY_TTL_SECONDS // 3600} h.",
        lifespan=lifespan,
    )
    app.state.job_cache = job_cache
    intake_limit = repository.IntakeLimit(rps=settings.intake_rps, burst=settings.intake_burst)
    bearer = HTTPBearer(auto_error=False)
    known_keys = ApiKeyCache(api_key_cache_seconds)

    @contextmanager
    def reading() -> Iterator[Connection]:
        # Reads need no transaction: autocommit spares the BEGIN/ROLLBACK round trip.
        with engine_provider().connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def look_up_key(api_key: str) -> Tenant | None:
        with reading() as conn:
            return repository.tenant_for_api_key(conn, api_key)

    # async: a key seen in the last seconds is answered on the event loop, without a
    # thread hop or a query; only a miss goes to PostgreSQL (in the thread pool).
    async def tenant(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Tenant:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise HTTPException(
                401, "Authorization: Bearer <API key> required", {"WWW-Authenticate": "Bearer"}
            )
        found = known_keys.get(credentials.credentials)
        if found is None:
            found = await run_in_threadpool(look_up_key, credentials.credentials)
            if found is None:
                raise HTTPException(401, "unknown API key", {"WWW-Authenticate": "Bearer"})
            known_keys.put(credentials.credentials, found)
        return found

    Caller = Annotated[Tenant, Depends(tenant)]
    JobId = Annotated[uuid.UUID, Path(description="The job's id (from the receipt)")]
    router = APIRouter(responses={**UNAUTHORIZED, **HEADERS_TOO_LARGE})

    def job_view(row: dict[str, Any]) -> JobView:
        result = None
        if row["result_key"] is not None and row["status"] == "succeeded":
            result = ResultInfo(
                size=row["result_size"],
                sha256=row["result_sha256"],
                content_type=row["result_content_type"],
                links={"result": f"/jobs/{row['id']}/result"},
            )
        return JobView(**{k: row[k] for k in JobView.model_fields if k != "result"}, result=result)

    @router.post(
        "/jobs",
        status_code=202,
        response_model=Receipt,
        responses={
            202: {
                "links": _job_links(
                    "GetJob", "CancelJob", "GetAttempts", "GetResult", "GetDeliveries"
                ),
                "headers": ratelimit.OPENAPI_HEADERS,
            },
            400: {"model": Problem, "description": "The body could not be read as JSON"},
            **BODY_TOO_LARGE,
            **RATE_LIMITED,
        },
        summary="Accept a job (202 with a receipt); never touches the target",
        callbacks=_webhook_callbacks().routes,
    )
    def submit(
        body: JobCreate,
        caller: Caller,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                max_length=255,
                description="Repeat a request safely: the same key and body return the same "
                "job; the same key with another body is 422",
            ),
        ] = None,
    ) -> JSONResponse:
        request = JobRequest(
            url=body.url,
            params=body.params,
            priority=body.priority,
            callback_url=body.callback_url,
        )
        limit_headers: dict[str, str] = {}
        try:
            if intake_limit.enabled:
                taken = repository.take_intake_token(engine_provider(), caller.id, intake_limit)
                limit_headers = ratelimit.headers(intake_limit, taken.remaining)
                if taken.wait_seconds > 0:
                    # A repeat of an accepted request costs one indexed read, only here:
                    # it is answered as intake would, so a client retrying a lost 202 is
                    # never refused (and spends no token while the bucket is empty).
                    replayed = None
                    if idempotency_key:
                        with reading() as conn:
                            replayed = repository.replayed_job(
                                conn, caller.id, request, idempotency_key
                            )
                    if replayed is None:
                        return ratelimit.refusal(intake_limit, taken.wait_seconds, limit_headers)
                    return receipt_response(replayed, limit_headers)
            submitted = repository.submit_job(
                engine_provider(), caller.id, request, idempotency_key or None
            )
        except IdempotencyKeyReused:
            raise ProblemError(
                422,
                "Idempotency-Key was already used with a different request body; use a new "
                "key for a new job",
                type_=problems.IDEMPOTENCY_KEY_REUSED,
                title="Idempotency-Key reused with another body",
                errors=[
                    FieldError(
                        detail="already used with a different request body",
                        parameter="Idempotency-Key",
                        in_="header",
                    )
                ],
            ) from None
        return receipt_response(submitted, limit_headers)

    def receipt_response(
        submitted: repository.Submitted, limit_headers: dict[str, str]
    ) -> JSONResponse:
        receipt = Receipt(
            id=submitted.id, status=submitted.status, links=Links(self=f"/jobs/{submitted.id}")
        )
        headers = {"Location": receipt.links.self, **limit_headers}
        if submitted.replayed:
            headers["Idempotent-Replayed"] = "true"
        return JSONResponse(receipt.model_dump(mode="json"), status_code=202, headers=headers)

    @router.get("/jobs/{job_id}", response_model=JobView, responses=NOT_FOUND)
    def read_job(job_id: JobId, caller: Caller) -> Response:
        # The cached body is the exact JSON a miss answers with (SCR-14); lists and the
        # other endpoints always read PostgreSQL.
        cached = job_cache.get(caller.id, job_id) if job_cache is not None else None
        if cached is not None and cached.body is not None:
            return Response(cached.body, media_type="application/json")
        with reading() as conn:
            row = repository.get_job(conn, caller.id, job_id)
        if row is None:
            raise HTTPException(404, "no such job")
        body = job_view(row).model_dump_json().encode()
        if job_cache is not None and cached is not None:
            job_cache.put(
                cached,
                body,
                terminal=row["status"] in TERMINAL,
                created_at=row["created_at"],
                updated_at=row["updated_at"],
            )
        return Response(body, media_type="application/json")

    @router.get("/jobs", response_model=JobList)
    def list_jobs(
        caller: Caller,
        status: Annotated[
            Literal["queued", "running", "succeeded", "failed", "cancelled"] | None,
            Query(description="Only jobs in this status"),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        cursor: Annotated[
            uuid.UUID | None, Query(description="next_cursor of the previous page")
        ] = None,
    ) -> JobList:
        with reading() as conn:
            rows = repository.list_jobs(
                conn, caller.id, status=status, limit=limit + 1, before_id=cursor
            )
        page = rows[:limit]
        next_cursor = str(page[-1]["id"]) if len(rows) > limit else None
        return JobList(items=[job_view(r) for r in page], next_cursor=next_cursor)

    @router.get(
        "/jobs/{job_id}/result",
        response_model=ResultLink,
        responses={
            **NOT_FOUND,
            **CONFLICT,
            410: {
                "model": Problem,
                "description": "The result was deleted by retention "
                "(PIN_RESULT_RETENTION_DAYS after the job finished)",
            },
        },
        summary="A signed, expiring URL of the stored result (409 until succeeded, 410 "
        "once expired)",
    )
    def result_link(job_id: JobId, caller: Caller) -> ResultLink:
        with reading() as conn:
            row = repository.get_job(conn, caller.id, job_id)
        if row is None:
            raise HTTPException(404, "no such job")
        if row["status"] != "succeeded":
            raise HTTPException(
                409, f"job is {row['status']}: a result exists once it has succeeded"
            )
        if row["result_expired_at"] is not None:
            raise HTTPException(
                410,
                f"the result was deleted by retention at "
                f"{row['result_expired_at'].astimezone(UTC).isoformat()}",
            )
        url, expires_at = store.signed_url(
            row["result_key"], ttl_seconds=settings.result_url_ttl_seconds
        )
        return ResultLink(url=url, expires_at=expires_at)

    @router.post(
        "/jobs/{job_id}/cancel",
        response_model=CancelAnswer,
        responses={
            200: {"links": _job_links("GetJob", "GetAttempts", "CancelJob")},
            **NOT_FOUND,
            **CONFLICT,
        },
        summary="Cancel: queued → cancelled now; running → at the worker's next check",
    )
    def cancel(job_id: JobId, caller: Caller) -> CancelAnswer:
        answer = repository.cancel_job(engine_provider(), caller.id, job_id)
        if answer is None:
            raise HTTPException(404, "no such job")
        status, changed = answer
        if not changed:
            raise HTTPException(409, f"job is {status} already")
        return CancelAnswer(id=job_id, status=status, cancel_requested=status == "running")

    @router.get("/jobs/{job_id}/attempts", response_model=AttemptList, responses=NOT_FOUND)
    def attempts(job_id: JobId, caller: Caller) -> AttemptList:
        with reading() as conn:
            if repository.get_job(conn, caller.id, job_id) is None:
                raise HTTPException(404, "no such job")
            rows = repository.list_attempts(conn, job_id)
        return AttemptList(items=[AttemptView(**r) for r in rows])

    @router.get(
        "/jobs/{job_id}/deliveries",
        response_model=DeliveryList,
        responses=NOT_FOUND,
        summary="Every attempt to deliver the job's completion webhook, oldest first",
    )
    def deliveries(job_id: JobId, caller: Caller) -> DeliveryList:
        with engine_provider().connect() as conn:
            if repository.get_job(conn, caller.id, job_id) is None:
                raise HTTPException(404, "no such job")
            rows = webhooks.list_deliveries(conn, job_id)
        return DeliveryList(items=[DeliveryView(**r) for r in rows])

    from pin_orchestration.scraping.batch_routes import batch_router

    # Before the job routes: /jobs/batch is not a job id.
    app.include_router(
        batch_router(tenant, engine_provider, intake_limit),
        responses={**UNAUTHORIZED, **HEADERS_TOO_LARGE},
    )
    app.include_router(router)

    if settings.metrics_token is not None:
        _serve_metrics_to_operators(
            app, engine_provider, job_cache, settings.metrics_token, settings
        )

    app.include_router(health_router(engine_provider))
    _mount_local_results(app, store)
    problems.install(app)
    _answer_405_with_every_allowed_method(app)
    _answer_too_deep_json_with_422(app)
    app.add_middleware(RequestSizeLimits, body_bytes_by_path={"/jobs/batch": MAX_BATCH_BODY_BYTES})
    return app


def _serve_metrics_to_operators(
    app: FastAPI,
    engine_provider: Callable[[], Engine],
    job_cache: JobCache | None,
    token: str,
    settings: ScrapingSettings,
) -> None:
    """GET /metrics for the bearer of PIN_METRICS_TOKEN: the scraping metrics (the same as
    `pin metrics serve`'s) and this process's read-cache counters. The gauges read from
    PostgreSQL are computed at most once per PIN_METRICS_CACHE_SECONDS."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from pin_orchestration.scraping.metrics import JobCacheCollector, ScrapingCollector

    expected = f"Bearer {token}".encode()
    collectors: list[Any] = []

    def registry() -> CollectorRegistry:
        if not collectors:  # the engine exists once the app has started
            collectors.append(
                ScrapingCollector(engine_provider(), cache_seconds=settings.metrics_cache_seconds)
            )
            if job_cache is not None:
                collectors.append(JobCacheCollector(job_cache))
        built = CollectorRegistry(auto_describe=False)
        for collector in collectors:
            built.register(collector)
        return built

    @app.get("/metrics", include_in_schema=False)
    def metrics(authorization: Annotated[str | None, Header()] = None) -> Response:
        given = (authorization or "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            return JSONResponse(
                {"detail": "/metrics wants the operators' token (PIN_METRICS_TOKEN) as a bearer"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return Response(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)


def _answer_405_with_every_allowed_method(app: FastAPI) -> None:
    """Starlette's 405 lists only the methods of the first route whose path matched; a path
    served by several routes (GET and POST /jobs) must list them all (RFC 9110 §15.5.6).
    A 405 an endpoint raised itself (a full match: GET /jobs/batch) keeps its own Allow."""
    from fastapi.routing import iter_route_contexts
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Match

    async def handler(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            allowed: set[str] = set()
            served = False
            # Every route, those of included routers too (FastAPI ≥ 0.165 keeps them
            # behind one entry per router in app.router.routes).
            for route in iter_route_contexts(app.router.routes):
                match, _ = route.matches(request.scope)
                served |= match == Match.FULL
                if match == Match.PARTIAL:
                    allowed |= set(route.methods or ())
            if not served:
                exc.headers = {**(exc.headers or {}), "Allow": ", ".join(sorted(allowed))}
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
    from pin_orchestration.scraping.store import LocalResultStore

    if isinstance(store, LocalResultStore):
        from pin_orchestration.scraping.store_routes import local_results_router

        app.include_router(local_results_router(store))


def app_from_env() -> FastAPI:
    """The app as `pin api` serves it: database and results store from the environment."""
    from pin_orchestration.db import create_db_engine, resolve_database_url
    from pin_orchestration.resources.scraping import result_store_from

    settings = ScrapingSettings.from_env()
    url = resolve_database_url()
    return create_app(lambda: create_db_engine(url), result_store_from(settings), settings)
