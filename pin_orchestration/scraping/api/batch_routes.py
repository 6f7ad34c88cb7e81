"""POST /jobs/batch: up to 1,000 jobs in one request and one transaction.

Each job is what POST /jobs takes, with its own optional `idempotency_key`, and is
accepted by the same intake path (the same checks, `repository.submit_jobs`' statement).
The answer lists, in order, each job's receipt or its problem: a job that does not validate
(or reuses a key with another body) is refused alone, unless `atomic` is true, when any
refusal stores nothing and the whole batch is a 422. The per-tenant intake limit
counts jobs: a batch takes one token per job it submits, all or none.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations.

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from pin_orchestration.scraping.api import problems, ratelimit
from pin_orchestration.scraping.api.deps import Caller, Deps
from pin_orchestration.scraping.api.job_models import JobCreate, Receipt, receipt_body
from pin_orchestration.scraping.api.limits import MAX_BATCH_BODY_BYTES
from pin_orchestration.scraping.api.problems import FieldError, Problem, ValidationProblem
from pin_orchestration.scraping.api.ratelimit import RateLimited
from pin_orchestration.scraping.store import repository
from pin_orchestration.scraping.store.repository import IdempotencyKeyReused, JobRequest

MAX_BATCH_JOBS = 1000


class _Refused:
    """A batch item that did not validate: its errors, kept instead of failing the batch."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors


class BatchJob(JobCreate):
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="As POST /jobs' Idempotency-Key header, for this job alone",
    )

    @field_validator("idempotency_key")
    @classmethod
    def _storable_key(cls, value: str | None) -> str | None:
        # A header cannot carry NUL or a lone surrogate; a JSON string can, and PostgreSQL
        # cannot store either: this job's 422, not the batch's 500.
        problem = None if value is None else repository.idempotency_key_problem(value)
        if problem:
            raise ValueError(f"idempotency_key {problem}")
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _refused_alone(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        # One job's errors become its own answer, not the request's 422.
        try:
            return handler(data)
        except ValidationError as exc:
            return _Refused(exc.errors(include_url=False))


class BatchCreate(BaseModel):
    jobs: list[BatchJob] = Field(min_length=1, max_length=MAX_BATCH_JOBS)
    atomic: bool = Field(
        default=False,
        description="true: store every job or none (any refused job makes the batch a 422)",
    )


class BatchItem(BaseModel):
    index: int = Field(description="The job's position in the request, from 0")
    status: int = Field(description="202: accepted (receipt); 422: refused (problem)")
    receipt: Receipt | None = None
    problem: ValidationProblem | None = None


class BatchAnswer(BaseModel):
    accepted: int
    refused: int
    items: list[BatchItem]


batch_router = APIRouter()


@batch_router.post(
    "/jobs/batch",
    status_code=202,
    response_model=BatchAnswer,
    responses={
        202: {"headers": ratelimit.OPENAPI_HEADERS},
        400: {"model": Problem, "description": "The body could not be read as JSON"},
        413: {
            "model": Problem,
            "description": f"The request body exceeds {MAX_BATCH_BODY_BYTES} bytes",
        },
        429: {
            "model": RateLimited,
            "description": "The tenant's bucket has fewer tokens than the batch has jobs "
            "(one per job): nothing was stored; retry after Retry-After",
            "headers": {
                "Retry-After": {
                    "description": "Seconds until the bucket holds the batch",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                },
                **ratelimit.OPENAPI_HEADERS,
            },
        },
    },
    summary="Accept up to 1,000 jobs in one transaction (202 with each job's receipt or problem)",
)
def submit_batch(body: BatchCreate, caller: Caller, deps: Deps) -> JSONResponse:
    intake_limit = deps.intake_limit
    refused = {
        i: _pointed(i, job.errors) for i, job in enumerate(body.jobs) if isinstance(job, _Refused)
    }
    if refused and body.atomic:
        raise _atomic_refusal(refused)
    valid = [(i, job) for i, job in enumerate(body.jobs) if isinstance(job, BatchJob)]
    if intake_limit.enabled and len(valid) > intake_limit.burst:
        raise problems.ProblemError(
            422,
            f"the batch has {len(valid)} jobs; the intake limit lets a tenant submit "
            f"at most {intake_limit.burst} at once (PIN_SCRAPING_INTAKE_BURST): split it",
            type_=problems.VALIDATION,
            title="The request is invalid",
            errors=[FieldError(detail="more jobs than the burst", pointer="/jobs")],
        )
    limit_headers: dict[str, str] = {}
    try:
        # The tokens and the jobs in one transaction, as POST /jobs: one connection, one
        # commit, and a batch that stores nothing spends no token. The bucket's row
        # stays locked until the commit; the tenant's other intakes of a class wait for
        # that commit anyway (the batch holds its fair-tag row, take_fair_tags).
        with deps.engine_provider().begin() as conn:
            if intake_limit.enabled and valid:
                taken = repository.take_intake_token(conn, caller.id, intake_limit, jobs=len(valid))
                limit_headers = ratelimit.headers(intake_limit, taken.remaining)
                if taken.wait_seconds > 0:
                    return ratelimit.refusal(
                        intake_limit, taken.wait_seconds, limit_headers, jobs=len(valid)
                    )
            answers = repository.submit_jobs(
                conn,
                caller.id,
                [(_request(job), job.idempotency_key) for _, job in valid],
                atomic=body.atomic,
            )
    except IdempotencyKeyReused as reused:
        index = valid[reused.position][0]  # the job that reused the key, not its first
        raise _atomic_refusal({index: [_key_reused(index)]}) from None
    items = {i: _refusal(i, errors) for i, errors in refused.items()}
    for (i, _), answer in zip(valid, answers, strict=True):
        if isinstance(answer, IdempotencyKeyReused):
            items[i] = _refusal(i, [_key_reused(i)])
        else:
            items[i] = {
                "index": i,
                "status": 202,
                "receipt": receipt_body(answer.id, answer.status),
            }
    ordered = [items[i] for i in range(len(body.jobs))]
    accepted = sum(1 for item in ordered if item["status"] == 202)
    # BatchAnswer's JSON (response_model documents it): built as dicts, see receipt_body
    return JSONResponse(
        {"accepted": accepted, "refused": len(ordered) - accepted, "items": ordered},
        status_code=202,
        headers=limit_headers,
    )


@batch_router.api_route(
    "/jobs/batch",
    methods=["GET", "PUT", "PATCH", "DELETE"],
    include_in_schema=False,
)
def batch_other_methods() -> None:
    # Else GET /jobs/batch would be read as GET /jobs/{job_id}, a 422 of a bad id.
    raise HTTPException(405, "POST /jobs/batch only", {"Allow": "POST"})


def _request(job: BatchJob) -> JobRequest:
    return JobRequest(
        url=job.url,
        params=job.params,
        priority=job.priority,
        callback_url=job.callback_url,
        timeout_seconds=job.timeout_seconds,
    )


def _pointed(index: int, errors: list[dict[str, Any]]) -> list[FieldError]:
    """The job's validation errors, pointing into the request (`/jobs/3/url`)."""
    return [
        FieldError(detail=e.detail, pointer=f"/jobs/{index}{e.pointer or ''}")
        for e in problems.field_errors(
            [{**error, "loc": ("body", *error["loc"])} for error in errors]
        )
    ]


def _key_reused(index: int) -> FieldError:
    return FieldError(
        detail="already used with a different request body; use a new key for a new job",
        pointer=f"/jobs/{index}/idempotency_key",
    )


def _refusal(index: int, errors: list[FieldError]) -> dict[str, Any]:
    problem = ValidationProblem(
        type=problems.VALIDATION,
        title="The job is invalid",
        status=422,
        detail="; ".join(f"{e.pointer}: {e.detail}" for e in errors),
        errors=errors,
    )
    item = BatchItem(index=index, status=422, problem=problem)
    return item.model_dump(mode="json", by_alias=True, exclude_none=True)


def _atomic_refusal(refused: dict[int, list[FieldError]]) -> problems.ProblemError:
    errors = [e for i in sorted(refused) for e in refused[i]]
    return problems.ProblemError(
        422,
        f"{len(refused)} of the jobs are invalid and the batch is atomic: nothing was "
        "stored; " + "; ".join(f"{e.pointer}: {e.detail}" for e in errors[:10]),
        type_=problems.VALIDATION,
        title="The request is invalid",
        errors=errors,
    )
