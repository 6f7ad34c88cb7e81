"""What the job endpoints take and answer (SCR-1, SCR-2): the request body, checked
before anything is stored, and the views of a job, its attempts and its deliveries.

A job's input is refused as a 422 naming the field when PostgreSQL could not store it
(NUL characters, lone surrogates, non-finite numbers) or it is not an http(s) URL the
worker may fetch; the OpenAPI schema says as much of that as JSON Schema can.
"""

import json
import math
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import to_json

from pin_orchestration.scraping.fetch import hosts
from pin_orchestration.scraping.fetch.hosts import MAX_URL_LENGTH
from pin_orchestration.scraping.worker.wait_reasons import WaitView

MAX_PARAMS_BYTES = 16 * 1024
# Levels of arrays and objects inside `params` (a job's query parameters are flat; this
# bounds the work of checking and storing them).
MAX_PARAMS_DEPTH = 32
# What the schema can say of a URL (scheme, a host, no whitespace); hosts.check_url, the
# one definition every door uses, says the rest.
URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s/?#]+([/?#]\S*)?$"
# params' size is json.dumps' (ASCII, non-ASCII escaped): at most 3 times the UTF-8 JSON
# pydantic_core writes in ~0.5 us (an escape is 6 bytes for 2 of UTF-8, 12 for 4), so only
# params within 3x of the limit pay for json.dumps (~5 us, ~2 ms of a batch of 400).
_ESCAPED_JSON_GROWTH = 3
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))

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


# The pattern is documented, not enforced: hosts.check_url says what is wrong in words, naming
# the field (a failed pattern would answer with the raw regular expression).
UrlText = Annotated[
    str, Field(max_length=MAX_URL_LENGTH, json_schema_extra={"pattern": URL_PATTERN})
]


# The longest a job's own timeout may be: a fetch holds a worker slot and a connection of
# its host that long.
MAX_JOB_TIMEOUT_SECONDS = 600.0


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
    # Per job: a slow site's job may wait longer, a quick check less (issue 31).
    timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_JOB_TIMEOUT_SECONDS,
        # a JSON number only: "5" or true read as 5 and 1 s made a string or a flag a timeout
        strict=True,
        description="Connect/read timeout and deadline of this job's fetch, seconds (at most "
        f"{MAX_JOB_TIMEOUT_SECONDS:g}); default the service's fetch timeout "
        "(PIN_SCRAPING_FETCH_TIMEOUT_SECONDS). Not part of an Idempotency-Key's body",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        hosts.check_url(value, "url")
        return value

    @field_validator("callback_url")
    @classmethod
    def _callback_url(cls, value: str | None) -> str | None:
        if value is not None:
            hosts.check_url(value, "callback_url")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_json_value(value, "params")
        if len(to_json(value)) * _ESCAPED_JSON_GROWTH <= MAX_PARAMS_BYTES:
            return value
        size = len(_COMPACT_JSON.encode(value))  # ASCII: its length is its bytes
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"params is {size} bytes as JSON; at most {MAX_PARAMS_BYTES}")
        return value


class Links(BaseModel):
    self: str


class Receipt(BaseModel):
    id: uuid.UUID
    status: str
    links: Links


def receipt_body(job_id: uuid.UUID, status: str) -> dict[str, Any]:
    """A Receipt as the JSON it answers with, built without the model: a batch answers
    with up to 1,000 of them, and 400 Receipt models and their dump took ~4 ms of its time
    (the schema tests hold this to the model)."""
    text_id = str(job_id)
    return {"id": text_id, "status": status, "links": {"self": f"/jobs/{text_id}"}}


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
    timeout_seconds: float | None = Field(
        None, description="The job's own fetch timeout; null: the service's"
    )
    wait: WaitView | None = Field(
        None,
        description="GET /jobs/{id} of a queued job: why it waits and until when (computed "
        "at as_of; a cached answer is at most 2 s old and never outlives its until); null "
        "otherwise and in lists",
    )


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
