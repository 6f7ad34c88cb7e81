"""The job endpoints (SCR-1, SCR-2): POST /jobs, the list, one job, its result link,
cancel, its attempts and its webhook deliveries.

Intake writes the job in one transaction (shared with the tenant's other POSTs in flight:
intake.py) and answers 202 with a receipt: it never touches the target. Queries return
only the caller's own jobs — another tenant's id is a 404, not a 403, so ids leak nothing.
Result bytes never pass through the API: `/jobs/{id}/result` hands out a signed, expiring
URL of the results store.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at
# definition time.

import uuid
from datetime import UTC
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Path, Query
from fastapi.responses import JSONResponse, Response

from pin_orchestration.scraping.api import problems, ratelimit
from pin_orchestration.scraping.api.deps import HEADERS_TOO_LARGE, UNAUTHORIZED, Caller, Deps
from pin_orchestration.scraping.api.job_models import (
    AttemptList,
    AttemptView,
    CancelAnswer,
    DeliveryList,
    DeliveryView,
    JobCreate,
    JobList,
    JobView,
    Receipt,
    ResultInfo,
    ResultLink,
    WebhookEvent,
    receipt_body,
)
from pin_orchestration.scraping.api.limits import MAX_BODY_BYTES
from pin_orchestration.scraping.api.problems import FieldError, Problem, ProblemError
from pin_orchestration.scraping.api.ratelimit import RateLimited
from pin_orchestration.scraping.store import repository
from pin_orchestration.scraping.store.repository import TERMINAL, IdempotencyKeyReused, JobRequest
from pin_orchestration.scraping.webhooks import deliveries as webhooks
from pin_orchestration.scraping.webhooks import signing
from pin_orchestration.scraping.worker.wait_reasons import job_wait


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


JobId = Annotated[uuid.UUID, Path(description="The job's id (from the receipt)")]
jobs_router = APIRouter(responses={**UNAUTHORIZED, **HEADERS_TOO_LARGE})


def job_view(row: dict[str, Any]) -> JobView:
    result = None
    if row["result_key"] is not None and row["status"] == "succeeded":
        result = ResultInfo(
            size=row["result_size"],
            sha256=row["result_sha256"],
            content_type=row["result_content_type"],
            links={"result": f"/jobs/{row['id']}/result"},
        )
    return JobView(
        **{k: row[k] for k in JobView.model_fields if k not in ("result", "wait")},
        result=result,
    )


@jobs_router.post(
    "/jobs",
    status_code=202,
    response_model=Receipt,
    responses={
        202: {
            "links": _job_links("GetJob", "CancelJob", "GetAttempts", "GetResult", "GetDeliveries"),
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
    deps: Deps,
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
        timeout_seconds=body.timeout_seconds,
    )
    try:
        # The token and the job in one transaction, shared with the tenant's other
        # requests in flight (intake.py): one commit for all of them.
        written = deps.intake.submit(caller.id, request, idempotency_key or None)
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
    limit_headers: dict[str, str] = {}
    if deps.intake_limit.enabled:
        limit_headers = ratelimit.headers(deps.intake_limit, written.remaining)
        if written.wait_seconds > 0:
            return ratelimit.refusal(deps.intake_limit, written.wait_seconds, limit_headers)
    assert written.submitted is not None
    return receipt_response(written.submitted, limit_headers)


def receipt_response(
    submitted: repository.Submitted, limit_headers: dict[str, str]
) -> JSONResponse:
    receipt = receipt_body(submitted.id, submitted.status)
    headers = {"Location": receipt["links"]["self"], **limit_headers}
    if submitted.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(receipt, status_code=202, headers=headers)


@jobs_router.get("/jobs/{job_id}", response_model=JobView, responses=NOT_FOUND)
def read_job(job_id: JobId, caller: Caller, deps: Deps) -> Response:
    # The cached body is the exact JSON a miss answers with (SCR-14); lists and the
    # other endpoints always read PostgreSQL.
    cached = deps.job_cache.get(caller.id, job_id) if deps.job_cache is not None else None
    if cached is not None and cached.body is not None:
        return Response(cached.body, media_type="application/json")
    with deps.reading() as conn:
        row = repository.get_job(conn, caller.id, job_id)
        # a queued job says why it waits (scraping/worker/wait_reasons.py)
        wait = (
            None
            if row is None
            else job_wait(
                conn,
                row,
                domain_defaults=deps.settings.domain_defaults,
                robots_mode=deps.settings.robots,
            )
        )
    if row is None:
        raise HTTPException(404, "no such job")
    body = job_view(row).model_copy(update={"wait": wait}).model_dump_json().encode()
    if deps.job_cache is not None and cached is not None:
        deps.job_cache.put(
            cached,
            body,
            terminal=row["status"] in TERMINAL,
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            # a copy never says a wait that has lifted
            not_after=wait.until if wait is not None else None,
        )
    return Response(body, media_type="application/json")


@jobs_router.get("/jobs", response_model=JobList)
def list_jobs(
    caller: Caller,
    deps: Deps,
    status: Annotated[
        Literal["queued", "running", "succeeded", "failed", "cancelled"] | None,
        Query(description="Only jobs in this status"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        uuid.UUID | None, Query(description="next_cursor of the previous page")
    ] = None,
) -> JobList:
    with deps.reading() as conn:
        rows = repository.list_jobs(
            conn, caller.id, status=status, limit=limit + 1, before_id=cursor
        )
    page = rows[:limit]
    next_cursor = str(page[-1]["id"]) if len(rows) > limit else None
    return JobList(items=[job_view(r) for r in page], next_cursor=next_cursor)


@jobs_router.get(
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
    summary="A signed, expiring URL of the stored result (409 until succeeded, 410 once expired)",
)
def result_link(job_id: JobId, caller: Caller, deps: Deps) -> ResultLink:
    with deps.reading() as conn:
        row = repository.get_job(conn, caller.id, job_id)
    if row is None:
        raise HTTPException(404, "no such job")
    if row["status"] != "succeeded":
        raise HTTPException(409, f"job is {row['status']}: a result exists once it has succeeded")
    if row["result_expired_at"] is not None:
        raise HTTPException(
            410,
            f"the result was deleted by retention at "
            f"{row['result_expired_at'].astimezone(UTC).isoformat()}",
        )
    url, expires_at = deps.store.signed_url(
        row["result_key"], ttl_seconds=deps.settings.result_url_ttl_seconds
    )
    return ResultLink(url=url, expires_at=expires_at)


@jobs_router.post(
    "/jobs/{job_id}/cancel",
    response_model=CancelAnswer,
    responses={
        200: {"links": _job_links("GetJob", "GetAttempts", "CancelJob")},
        **NOT_FOUND,
        **CONFLICT,
    },
    summary="Cancel: queued → cancelled now; running → at the worker's next check",
)
def cancel(job_id: JobId, caller: Caller, deps: Deps) -> CancelAnswer:
    answer = repository.cancel_job(deps.engine_provider(), caller.id, job_id)
    if answer is None:
        raise HTTPException(404, "no such job")
    status, changed = answer
    if not changed:
        raise HTTPException(409, f"job is {status} already")
    return CancelAnswer(id=job_id, status=status, cancel_requested=status == "running")


@jobs_router.get("/jobs/{job_id}/attempts", response_model=AttemptList, responses=NOT_FOUND)
def attempts(job_id: JobId, caller: Caller, deps: Deps) -> AttemptList:
    with deps.reading() as conn:
        if repository.get_job(conn, caller.id, job_id) is None:
            raise HTTPException(404, "no such job")
        rows = repository.list_attempts(conn, job_id)
    return AttemptList(items=[AttemptView(**r) for r in rows])


@jobs_router.get(
    "/jobs/{job_id}/deliveries",
    response_model=DeliveryList,
    responses=NOT_FOUND,
    summary="Every attempt to deliver the job's completion webhook, oldest first",
)
def deliveries(job_id: JobId, caller: Caller, deps: Deps) -> DeliveryList:
    with deps.engine_provider().connect() as conn:
        if repository.get_job(conn, caller.id, job_id) is None:
            raise HTTPException(404, "no such job")
        rows = webhooks.list_deliveries(conn, job_id)
    return DeliveryList(items=[DeliveryView(**r) for r in rows])
