"""The retry planner (SPEC SCR-6): what happens to a scraping job after one attempt.

Pure functions: the worker passes the attempt's outcome, the clock and a random source,
and gets back a `Decision`. Nothing here touches the database or the network.

| attempt outcome                                   | class     | decision                      |
|---------------------------------------------------|-----------|-------------------------------|
| HTTP 2xx                                          | —         | `succeeded`                   |
| fetch error `timeout`, `connection_error`         | transient | `retry` (or `failed` when the |
| HTTP 408, 429, 5xx                                | transient |  attempts are exhausted)      |
| `worker_error` (the attempt raised anything else: | transient |                               |
| a bug, a results store failing)                   |           |                               |
| HTTP 1xx, 3xx (a redirect left unfollowed), other | permanent | `failed` at once              |
| 4xx (401, 403, 404, …), any status outside 1xx-5xx|           |                               |
| fetch error `invalid_url`, `invalid_response`,    | permanent | `failed` at once              |
| `body_too_large`, `refused_address`,              |           |                               |
| `too_many_redirects`                              |           |                               |
| fetch error `cancelled`                           | —         | `ValueError`: the worker marks|
|                                                   |           | the job cancelled itself      |

A retry is due at `now + backoff_delay(attempt)` (exponential backoff with full jitter:
uniform over `[0, min(cap, base * 2**(attempt-1))]`), and never earlier than the target's
`Retry-After` (delay-seconds or an HTTP-date, RFC 9110 §10.2.3), itself capped at
`max_pause_seconds` as a domain's pause is. A `Retry-After` asking for no wait (`0`, a
past date) is as if absent: the backoff stands, and a 429 still pauses its domain for
`backoff_base_seconds` (`domain_pause_until`). `attempt` is the number of the attempt just
made, counting from 1; once it reaches `max_attempts` a transient outcome fails the job
too, saying the attempts are exhausted.

`error_class` of a decision is the fetch error class, or `http_<status>` for an answer
that was not a success (`http_503`, `http_404`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pin_orchestration.scraping.fetch.headers import parse_retry_after

TRANSIENT, PERMANENT = "transient", "permanent"

# worker_error: the attempt raised something unforeseen (a bug, a results store that
# failed): worth another attempt, within the budget and after the backoff like any other,
# so a cause that persists fails the job instead of retrying it for ever.
TRANSIENT_ERROR_CLASSES = frozenset({"timeout", "connection_error", "worker_error"})
PERMANENT_ERROR_CLASSES = frozenset(
    {
        "invalid_url",
        "invalid_response",
        "body_too_large",
        "refused_address",
        "too_many_redirects",
    }
)
TRANSIENT_STATUS_CODES = frozenset({408, 429})

MAX_ERROR_DETAIL_CHARS = 512


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    backoff_base_seconds: float = 2.0
    backoff_cap_seconds: float = 600.0
    # The longest a 429 / Retry-After pauses a domain for every worker
    # (PIN_SCRAPING_MAX_PAUSE_SECONDS; scraping.pause_domain caps it again).
    max_pause_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.backoff_base_seconds < 0:
            raise ValueError(
                f"backoff_base_seconds must not be negative, got {self.backoff_base_seconds}"
            )
        if self.backoff_cap_seconds < 0:
            raise ValueError(
                f"backoff_cap_seconds must not be negative, got {self.backoff_cap_seconds}"
            )


@dataclass(frozen=True)
class Decision:
    outcome: Literal["succeeded", "retry", "failed"]
    error_class: str | None
    error_detail: str | None
    next_attempt_at: datetime | None


def classify_status(status_code: int) -> Literal["transient", "permanent"] | None:
    """`None` for a success, else whether the answer is worth another attempt."""
    if 200 <= status_code <= 299:
        return None
    if status_code in TRANSIENT_STATUS_CODES or 500 <= status_code <= 599:
        return TRANSIENT
    return PERMANENT


def classify_error(error_class: str) -> Literal["transient", "permanent"]:
    if error_class in TRANSIENT_ERROR_CLASSES:
        return TRANSIENT
    if error_class in PERMANENT_ERROR_CLASSES:
        return PERMANENT
    if error_class == "cancelled":
        raise ValueError(
            "a cancelled attempt is not a retry decision: the worker marks the job cancelled"
        )
    # An unknown class is a bug in the caller; failing jobs quietly under it would hide it.
    raise ValueError(f"unknown fetch error class {error_class!r}")


def domain_pause_until(
    status_code: int, retry_after: str | None, policy: RetryPolicy, now: datetime
) -> datetime | None:
    """Until when every worker should leave the answering domain alone, or `None`.

    A non-success answer carrying `Retry-After` pauses the domain until then (as long as
    the job's own retry waits: the target asked it of every request); a 429 pauses it for
    `backoff_base_seconds` at least. A success never pauses.

    One rule for a `Retry-After` that asks for no wait (`0`, a date now or past), here and
    in `decide`: it is as if absent. A 429 saying "retry now" still pauses its domain for
    the floor, as a 429 without the header does (it lifted the floor: no pause at all),
    and the job's retry still waits its backoff."""
    _require_aware(now)
    if classify_status(status_code) is None:
        return None
    until = parse_retry_after(retry_after, now)
    if status_code == 429:
        floor = now + timedelta(seconds=policy.backoff_base_seconds)
        until = floor if until is None else max(until, floor)
    if until is None or until <= now:
        return None
    return min(until, now + timedelta(seconds=policy.max_pause_seconds))


def backoff_delay(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait after attempt number `attempt` (1-based): full jitter over the
    exponential ceiling `min(cap, base * 2**(attempt-1))`, so retries of many jobs that
    failed together spread out instead of arriving together again."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    # 2**63 already exceeds any sane cap; bounding the exponent keeps the float finite.
    ceiling = min(
        policy.backoff_cap_seconds, policy.backoff_base_seconds * 2.0 ** min(attempt - 1, 63)
    )
    return rng.uniform(0.0, ceiling)


def decide(
    *,
    attempt: int,
    status_code: int | None,
    error_class: str | None,
    retry_after: str | None,
    policy: RetryPolicy,
    now: datetime,
    rng: random.Random,
    error_detail: str | None = None,
) -> Decision:
    """Plan what follows attempt number `attempt` (1-based) of a job.

    Pass either the answer's `status_code` (the target answered) or the fetch's
    `error_class` (it did not), never both. `retry_after` is the answer's `Retry-After`
    header, if any; `error_detail` the fetch error's own text, kept in the decision's
    detail.
    """
    _require_aware(now)
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if (status_code is None) == (error_class is None):
        raise ValueError("pass exactly one of status_code (an answer) or error_class (no answer)")

    if status_code is not None:
        kind = classify_status(status_code)
        if kind is None:
            return Decision("succeeded", None, None, None)
        decided_class = f"http_{status_code}"
        reason = _status_reason(status_code)
    else:
        assert error_class is not None
        kind = classify_error(error_class)
        decided_class = error_class
        reason = error_detail or error_class.replace("_", " ")

    if kind == PERMANENT:
        return Decision("failed", decided_class, _detail(reason, "not retried"), None)
    if attempt >= policy.max_attempts:
        return Decision(
            "failed",
            decided_class,
            _detail(reason, f"attempts exhausted ({attempt} of {policy.max_attempts})"),
            None,
        )
    next_attempt_at = now + timedelta(seconds=backoff_delay(attempt, policy, rng))
    not_before = parse_retry_after(retry_after, now)
    if not_before is not None and not_before > next_attempt_at:
        # Capped as the domain's pause is: a target asking for year 9999 does not park
        # the job there.
        next_attempt_at = min(not_before, now + timedelta(seconds=policy.max_pause_seconds))
    return Decision(
        "retry",
        decided_class,
        _detail(reason, f"attempt {attempt} of {policy.max_attempts} failed, will retry"),
        next_attempt_at,
    )


def _status_reason(status_code: int) -> str:
    if 300 <= status_code <= 399:
        return f"HTTP {status_code} from the target (redirect not followed)"
    return f"HTTP {status_code} from the target"


def _detail(reason: str, verdict: str) -> str:
    """`reason; verdict`, the reason shortened so the verdict always fits the limit."""
    room = MAX_ERROR_DETAIL_CHARS - len(verdict) - 2
    if len(reason) > room:
        reason = reason[: room - 1] + "…"
    return f"{reason}; {verdict}"


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
