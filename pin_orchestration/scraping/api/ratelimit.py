"""The RateLimit header fields (IETF httpapi draft "RateLimit header fields for HTTP")
of the per-tenant intake limit, on every POST /jobs and POST /jobs/batch answer and on
their 429s beside Retry-After (which stays the normative header of a 429).

The limit is a token bucket (PIN_SCRAPING_INTAKE_RPS refilling PIN_SCRAPING_INTAKE_BURST),
told as the draft's quota policy: `q` = the burst, `w` = the seconds the bucket takes to
refill from empty; `r` = jobs the tenant may submit now, `t` = seconds until the bucket
is full again.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import Field

from pin_orchestration.scraping.api import problems
from pin_orchestration.scraping.api.problems import Problem
from pin_orchestration.scraping.store.repository import IntakeLimit

POLICY = "intake"
POLICY_HEADER = "RateLimit-Policy"
HEADER = "RateLimit"


def headers(limit: IntakeLimit, remaining: float) -> dict[str, str]:
    """The two header fields for a bucket with `remaining` tokens; none when the limit is
    switched off (PIN_SCRAPING_INTAKE_RPS=0)."""
    if not limit.enabled:
        return {}
    window = max(1, math.ceil(limit.burst / limit.rps))
    left = max(0, math.floor(remaining))
    full_in = max(0, math.ceil((limit.burst - remaining) / limit.rps))
    return {
        POLICY_HEADER: f'"{POLICY}";q={limit.burst};w={window}',
        HEADER: f'"{POLICY}";r={left};t={full_in}',
    }


# The OpenAPI description of the two fields, for the answers that carry them.
OPENAPI_HEADERS: dict[str, Any] = {
    POLICY_HEADER: {
        "description": 'The intake quota, e.g. `"intake";q=400;w=15`: a tenant may submit '
        "q jobs at once, refilled over w seconds (absent with the limit off)",
        "schema": {"type": "string"},
    },
    HEADER: {
        "description": 'What is left of it, e.g. `"intake";r=399;t=1`: r jobs may be '
        "submitted now; the quota is whole again in t seconds",
        "schema": {"type": "string"},
    },
}


class RateLimited(Problem):
    """A problem document with the limit that was reached."""

    limit: Literal["intake"] = Field(
        description="The limit reached: intake = POST /jobs and POST /jobs/batch per tenant, "
        "one token per job (PIN_SCRAPING_INTAKE_RPS, PIN_SCRAPING_INTAKE_BURST)"
    )
    rate_per_second: float = Field(description="Jobs a tenant may submit per second")
    burst: int = Field(description="Jobs a tenant may submit at once after a pause")
    retry_after_seconds: int = Field(description="The Retry-After header's value")


def refusal(
    limit: IntakeLimit, wait_seconds: float, limit_headers: dict[str, str], jobs: int = 1
) -> JSONResponse:
    """The 429 of an intake refused by the limit: nothing was stored."""
    retry_after = max(1, math.ceil(wait_seconds))
    needed = f"the batch's {jobs} jobs need as many tokens; " if jobs > 1 else ""
    answer = RateLimited(
        type=problems.RATE_LIMITED,
        title="Intake rate limit reached",
        status=429,
        detail=f"intake rate limit reached: {needed}a tenant may submit "
        f"{limit.rps:g} jobs/s, {limit.burst} at once "
        f"(PIN_SCRAPING_INTAKE_RPS, PIN_SCRAPING_INTAKE_BURST); nothing was stored, "
        f"retry after {retry_after} s",
        limit="intake",
        rate_per_second=limit.rps,
        burst=limit.burst,
        retry_after_seconds=retry_after,
    )
    return JSONResponse(
        answer.model_dump(mode="json", exclude_none=True),
        status_code=429,
        headers={"Retry-After": str(retry_after), **limit_headers},
        media_type=problems.MEDIA_TYPE,
    )
