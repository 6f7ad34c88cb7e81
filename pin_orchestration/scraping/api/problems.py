"""RFC 9457 problem details for every error the scraping API answers.

Every 4xx/5xx is `application/problem+json` with `type`, `title`, `status` and `detail`; a
422 adds `errors`, one per wrong field: a JSON Pointer into the body (`"pointer": "/url"`)
or the header/query/path parameter it names (`"parameter": "Idempotency-Key", "in":
"header"`). `install` wires the handlers into the app and rewrites its OpenAPI document so
every error status is documented as such a problem.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any, Literal

import sqlalchemy.exc
from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

MEDIA_TYPE = "application/problem+json"
# Problem types of our own: absolute URIs (RFC 9457 §3.1.1) that are names, not pages;
# every other error is "about:blank", its title the HTTP status phrase.
TYPE_BASE = "tag:pin-orchestration,2026:problems:"
VALIDATION = TYPE_BASE + "validation-error"
RATE_LIMITED = TYPE_BASE + "rate-limited"
IDEMPOTENCY_KEY_REUSED = TYPE_BASE + "idempotency-key-reused"

logger = logging.getLogger(__name__)


class FieldError(BaseModel):
    detail: str = Field(description="What is wrong with this field and how to fix it")
    pointer: str | None = Field(
        default=None, description="JSON Pointer (RFC 6901) to the field in the request body"
    )
    parameter: str | None = Field(
        default=None, description="The header, query or path parameter at fault"
    )
    in_: Literal["header", "query", "path"] | None = Field(
        default=None, alias="in", description="Where `parameter` is"
    )

    model_config = ConfigDict(populate_by_name=True)


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str = Field(
        default="about:blank", description="URI naming the kind of problem (RFC 9457 §3.1.1)"
    )
    title: str = Field(description="Short summary of the kind of problem")
    status: int = Field(description="The HTTP status code of this answer")
    detail: str = Field(description="What went wrong this time, naming the field or header")
    instance: str | None = Field(default=None, description="The request path")


class ValidationProblem(Problem):
    errors: list[FieldError] = Field(description="One entry per wrong field")


class ProblemError(Exception):
    """Raise to answer with a problem of a type of our own."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        type_: str = "about:blank",
        title: str | None = None,
        errors: Sequence[FieldError] = (),
        headers: Mapping[str, str] | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.type = type_
        self.title = title
        self.errors = list(errors)
        self.headers = dict(headers or {})
        self.extensions = dict(extensions or {})


def problem_body(
    status: int,
    detail: str,
    *,
    type_: str = "about:blank",
    title: str | None = None,
    instance: str | None = None,
    errors: Sequence[FieldError] = (),
    extensions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": type_,
        "title": title or _phrase(status),
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    if errors:
        body["errors"] = [e.model_dump(by_alias=True, exclude_none=True) for e in errors]
    body.update(extensions or {})
    return body


def problem_response(
    status: int, detail: str, *, headers: Mapping[str, str] | None = None, **fields: Any
) -> JSONResponse:
    return JSONResponse(
        jsonable_encoder(problem_body(status, detail, **fields)),
        status_code=status,
        headers=dict(headers or {}),
        media_type=MEDIA_TYPE,
    )


def _printable(value: Any) -> str:
    """A name or message as UTF-8 can carry it (lone surrogates written as \\udXXX escapes):
    a key of the body is echoed in the pointer, and JSON cannot carry every str."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def field_errors(validation_errors: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    """FastAPI's validation errors (`loc`, `msg`) as problem entries pointing at the field.
    The input is never echoed: a URL may hold credentials, and JSON cannot carry every
    input (lone surrogates, NaN, Infinity)."""
    found = []
    for error in validation_errors:
        where, *path = [_printable(p) for p in error.get("loc") or ("body",)]
        message = _printable(error.get("msg", "invalid"))
        if where == "body":
            pointer = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)
            found.append(FieldError(detail=message, pointer=pointer))
        else:
            name = str(path[0]) if path else str(where)
            found.append(FieldError(detail=message, parameter=name, in_=where))
    return found


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


async def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
    detail = exc.detail if isinstance(exc.detail, str) else _phrase(exc.status_code)
    if exc.status_code in (204, 304):  # no body allowed
        return Response(status_code=exc.status_code, headers=exc.headers)
    return problem_response(exc.status_code, detail, headers=exc.headers, instance=request.url.path)


async def _validation_problem(request: Request, exc: RequestValidationError) -> Response:
    errors = field_errors(exc.errors())
    named = "; ".join(f"{e.pointer or e.parameter or '(the body)'}: {e.detail}" for e in errors)
    return problem_response(
        422,
        f"the request is invalid: {named}",
        type_=VALIDATION,
        title="The request is invalid",
        instance=request.url.path,
        errors=errors,
    )


async def _raised_problem(request: Request, exc: ProblemError) -> Response:
    return problem_response(
        exc.status,
        exc.detail,
        headers=exc.headers,
        type_=exc.type,
        title=exc.title,
        instance=request.url.path,
        errors=exc.errors,
        extensions=exc.extensions,
    )


# How long a client is asked to wait while the database does not answer: a restart or a
# failover takes seconds; the pool's own wait for a connection has already passed.
DATABASE_RETRY_AFTER_SECONDS = 2


async def _database_unavailable_problem(request: Request, exc: Exception) -> Response:
    # Unreachable, restarting, out of connections (the pool's wait passed), a statement
    # cancelled or a deadlock victim: the request did nothing wrong and may be sent again,
    # which is what a 503 with Retry-After tells clients and SDKs (a 500 is not retried).
    # The exception's text names the server: it goes to the log, never to the client.
    logger.warning("database unavailable for %s %s: %s", request.method, request.url.path, exc)
    return problem_response(
        503,
        "the database is not answering (restarting, unreachable or busy); send the request "
        "again after Retry-After",
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        instance=request.url.path,
    )


async def _unexpected_problem(request: Request, exc: Exception) -> Response:
    # Starlette still logs the exception; the client learns nothing of its text.
    return problem_response(500, "an unexpected error; it was logged", instance=request.url.path)


def install(app: FastAPI) -> None:
    """Answer every error as a problem and document every error status as one. (A
    handler of HTTPException registered later, to add headers, ends with `http_problem`.)"""
    app.add_exception_handler(StarletteHTTPException, http_problem)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_problem)  # type: ignore[arg-type]
    app.add_exception_handler(ProblemError, _raised_problem)  # type: ignore[arg-type]
    for unavailable in (sqlalchemy.exc.OperationalError, sqlalchemy.exc.TimeoutError):
        app.add_exception_handler(unavailable, _database_unavailable_problem)
    app.add_exception_handler(Exception, _unexpected_problem)
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def document_problems(schema: dict[str, Any]) -> dict[str, Any]:
    """Every error response of every operation as `application/problem+json`: 422 a
    ValidationProblem, others the schema they name (a Problem or an extension of it).
    Callbacks document the client's receiver, whose errors are not ours: none kept."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, model in (("Problem", Problem), ("ValidationProblem", ValidationProblem)):
        for defined, definition in _json_schemas(model).items():
            components.setdefault(defined, definition)
        components[name] = _json_schemas(model)[name]
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.get("responses", {})
            for status, response in responses.items():
                if status[0] not in "45":
                    continue
                if status == "422":
                    ref = "#/components/schemas/ValidationProblem"
                else:
                    content = response.get("content", {})
                    documented = next(iter(content.values()), {}).get("schema")
                    ref = (documented or {}).get("$ref", "#/components/schemas/Problem")
                response["content"] = {MEDIA_TYPE: {"schema": {"$ref": ref}}}
            for callback in operation.get("callbacks", {}).values():
                for callback_path in callback.values():
                    for callback_operation in callback_path.values():
                        callback_operation.get("responses", {}).pop("422", None)
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return schema


def _json_schemas(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema and those of the models it uses, by name."""
    definition = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    nested = definition.pop("$defs", {})
    return {**nested, model.__name__: definition}
