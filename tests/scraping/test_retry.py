"""The retry planner's table, Retry-After in both forms, and the backoff bounds."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from pin_orchestration.scraping.worker.retry import (
    MAX_ERROR_DETAIL_CHARS,
    Decision,
    RetryPolicy,
    backoff_delay,
    decide,
    domain_pause_until,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_attempts=5, backoff_base_seconds=2.0, backoff_cap_seconds=600.0)


def _decide(
    *,
    attempt: int = 1,
    status_code: int | None = None,
    error_class: str | None = None,
    retry_after: str | None = None,
    policy: RetryPolicy = POLICY,
    error_detail: str | None = None,
) -> Decision:
    return decide(
        attempt=attempt,
        status_code=status_code,
        error_class=error_class,
        retry_after=retry_after,
        policy=policy,
        now=NOW,
        rng=random.Random(7),
        error_detail=error_detail,
    )


@pytest.mark.parametrize("status_code", [200, 201, 204, 299])
def test_2xx_succeeds(status_code: int) -> None:
    assert _decide(status_code=status_code) == Decision("succeeded", None, None, None)


@pytest.mark.parametrize("status_code", [408, 429, 500, 502, 503, 504, 599])
def test_transient_statuses_retry_with_a_later_attempt(status_code: int) -> None:
    decision = _decide(status_code=status_code)
    assert decision.outcome == "retry"
    assert decision.error_class == f"http_{status_code}"
    assert decision.next_attempt_at is not None
    assert NOW <= decision.next_attempt_at <= NOW + timedelta(seconds=2)
    assert decision.error_detail is not None and str(status_code) in decision.error_detail


@pytest.mark.parametrize("error_class", ["timeout", "connection_error"])
def test_transient_fetch_errors_retry(error_class: str) -> None:
    decision = _decide(error_class=error_class, error_detail="no answer within 30 s")
    assert decision.outcome == "retry"
    assert decision.error_class == error_class
    assert decision.error_detail is not None
    assert decision.error_detail.startswith("no answer within 30 s")


@pytest.mark.parametrize("status_code", [100, 301, 302, 304, 400, 401, 403, 404, 410, 422, 600])
def test_permanent_statuses_fail_at_once(status_code: int) -> None:
    decision = _decide(status_code=status_code, retry_after="5")
    assert decision.outcome == "failed"
    assert decision.error_class == f"http_{status_code}"
    assert decision.next_attempt_at is None
    assert decision.error_detail is not None and "not retried" in decision.error_detail


@pytest.mark.parametrize(
    "error_class",
    ["invalid_url", "invalid_response", "body_too_large", "refused_address", "too_many_redirects"],
)
def test_permanent_fetch_errors_fail_at_once(error_class: str) -> None:
    decision = _decide(error_class=error_class)
    assert (decision.outcome, decision.error_class, decision.next_attempt_at) == (
        "failed",
        error_class,
        None,
    )


def test_cancelled_and_unknown_classes_are_not_decisions() -> None:
    with pytest.raises(ValueError, match="cancelled"):
        _decide(error_class="cancelled")
    with pytest.raises(ValueError, match="unknown fetch error class"):
        _decide(error_class="tiemout")


def test_exactly_one_of_status_and_error() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        _decide()
    with pytest.raises(ValueError, match="exactly one"):
        _decide(status_code=503, error_class="timeout")


def test_attempts_exhausted_fail_with_the_last_reason() -> None:
    assert _decide(attempt=4, status_code=503).outcome == "retry"
    decision = _decide(attempt=5, status_code=503)
    assert decision.outcome == "failed"
    assert decision.error_class == "http_503"
    assert decision.next_attempt_at is None
    assert decision.error_detail is not None
    assert "attempts exhausted (5 of 5)" in decision.error_detail
    # A single allowed attempt never retries.
    single = _decide(attempt=1, error_class="timeout", policy=RetryPolicy(max_attempts=1))
    assert single.outcome == "failed"


def test_retry_after_holds_the_retry_back() -> None:
    decision = _decide(status_code=429, retry_after="120")
    assert decision.next_attempt_at == NOW + timedelta(seconds=120)
    http_date = "Mon, 30 Nov 2026 12:30:00 GMT"
    decision = _decide(status_code=503, retry_after=http_date)
    assert decision.next_attempt_at == datetime(2026, 11, 30, 12, 30, tzinfo=UTC)


def test_backoff_wins_over_an_earlier_retry_after() -> None:
    # attempt 9: ceiling min(600, 2 * 256) = 512 s; with seed 7 the jittered delay is
    # well above the 1 s the target asked for.
    expected = backoff_delay(9, POLICY, random.Random(7))
    assert expected > 1
    decision = _decide(attempt=9, status_code=503, retry_after="1", policy=RetryPolicy(10))
    assert decision.next_attempt_at == NOW + timedelta(seconds=expected)
    past = _decide(
        attempt=9,
        status_code=503,
        retry_after="Sun, 06 Nov 1994 08:49:37 GMT",
        policy=RetryPolicy(10),
    )
    assert past.next_attempt_at == NOW + timedelta(seconds=expected)


def test_backoff_is_full_jitter_under_the_exponential_ceiling_and_the_cap() -> None:
    rng = random.Random(1)
    for attempt, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (6, 64.0), (9, 512.0), (10, 600.0)]:
        delays = [backoff_delay(attempt, POLICY, rng) for _ in range(2000)]
        assert min(delays) >= 0
        assert max(delays) <= ceiling
        # Full jitter spreads over the whole range, not just near the ceiling.
        assert min(delays) < 0.05 * ceiling
        assert max(delays) > 0.95 * ceiling
    assert backoff_delay(5000, POLICY, rng) <= 600.0
    with pytest.raises(ValueError, match="attempt counts from 1"):
        backoff_delay(0, POLICY, rng)


def test_detail_is_bounded_and_keeps_the_verdict() -> None:
    decision = _decide(attempt=5, error_class="timeout", error_detail="x" * 2000)
    assert decision.error_detail is not None
    assert len(decision.error_detail) <= MAX_ERROR_DETAIL_CHARS
    assert decision.error_detail.endswith("attempts exhausted (5 of 5)")


def test_a_retry_detail_counts_the_attempt_that_just_failed() -> None:
    first = _decide(attempt=1, status_code=503)
    assert first.error_detail == "HTTP 503 from the target; attempt 1 of 5 failed, will retry"
    fourth = _decide(attempt=4, error_class="timeout", error_detail="no answer within 30 s")
    assert fourth.error_detail == "no answer within 30 s; attempt 4 of 5 failed, will retry"


def test_a_retry_after_is_capped_as_a_domain_pause_is() -> None:
    policy = RetryPolicy(max_attempts=5, max_pause_seconds=300)
    far = _decide(status_code=503, retry_after="Fri, 31 Dec 9999 23:59:59 GMT", policy=policy)
    assert far.next_attempt_at == NOW + timedelta(seconds=300)
    huge = _decide(status_code=429, retry_after="99999999", policy=policy)
    assert huge.next_attempt_at == NOW + timedelta(seconds=300)


def test_a_worker_error_is_transient_with_a_budget() -> None:
    first = _decide(attempt=1, error_class="worker_error", error_detail="OSError: disk full")
    assert first.outcome == "retry" and first.next_attempt_at is not None
    assert first.next_attempt_at <= NOW + timedelta(seconds=POLICY.backoff_base_seconds)
    last = _decide(attempt=5, error_class="worker_error", error_detail="OSError: disk full")
    assert (last.outcome, last.error_class) == ("failed", "worker_error")


@pytest.mark.parametrize(
    "retry_after", ["0", "  0 ", "Sun, 06 Nov 1994 08:49:37 GMT", "soon", None]
)
def test_a_retry_after_asking_no_wait_is_as_if_absent(retry_after: str | None) -> None:
    # One rule for a Retry-After at or before now (0 s, a past date): it asks for no wait,
    # so it is treated as absent. The job's retry waits its backoff; a 429 pauses its
    # domain for the floor (backoff_base_seconds), as a 429 without the header does. (A
    # `Retry-After: 0` lifted the floor: the domain was not paused at all.)
    absent = _decide(status_code=429)
    assert _decide(status_code=429, retry_after=retry_after) == absent
    floor = NOW + timedelta(seconds=POLICY.backoff_base_seconds)
    assert domain_pause_until(429, retry_after, POLICY, NOW) == floor
    # A 503 pauses nothing unless its Retry-After asks for a wait.
    assert domain_pause_until(503, retry_after, POLICY, NOW) is None


def test_a_429_pause_is_the_later_of_the_floor_and_its_retry_after() -> None:
    policy = RetryPolicy(max_attempts=5, backoff_base_seconds=10.0, max_pause_seconds=300)
    assert domain_pause_until(429, "3", policy, NOW) == NOW + timedelta(seconds=10)
    assert domain_pause_until(429, "120", policy, NOW) == NOW + timedelta(seconds=120)
    assert domain_pause_until(429, "99999", policy, NOW) == NOW + timedelta(seconds=300)
    assert domain_pause_until(503, "3", policy, NOW) == NOW + timedelta(seconds=3)
