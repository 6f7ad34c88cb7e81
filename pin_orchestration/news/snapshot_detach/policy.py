"""The retry policy of news-snapshot-detach-retry: options, backoff, and `decide` (what an
answer of selections does to a claimed row)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum

from pin_orchestration.coordination.job_identity import JobIdentity
from pin_orchestration.news.selections import CallKind, CallResult
from pin_orchestration.platform.options import option

DETACH_JOB = JobIdentity("news_snapshot_detach_retry")
LAST_ERROR_MAX = 512

RandomSource = Callable[[], float]


class Reason(StrEnum):
    BLOCK_REPLACED = "BlockReplaced"
    POST_DELETED = "PostDeleted"


class Status(StrEnum):
    PENDING = "Pending"
    DONE = "Done"
    QUARANTINED = "Quarantined"


class SnapshotDetachConfigError(ValueError):
    """The run's options are invalid; raised before any work is done."""


@dataclass(frozen=True)
class DetachOptions:
    """SnapshotDetachRetryOptions of the seed (TimeSpans in seconds), plus the concurrency.

    DetachCallTimeout belongs to the selections client (`SelectionsResource`), and
    PollingInterval to the sensor; both validate their own values.
    """

    batch_size: int = option(100, "Rows per claim (> 0)")
    max_run_duration_seconds: float = option(4 * 60, "Upper bound of one run")
    max_attempts: int = option(12, "Attempts before an entry is Quarantined")
    backoff_base_seconds: float = option(60, "Delay after the first failed call")
    backoff_factor: float = option(2.0, "Each further failure multiplies the delay by this")
    backoff_cap_seconds: float = option(30 * 60, "Longest delay between attempts")
    # Jitter spreads the retries of a burst of failures.
    backoff_jitter_ratio: float = option(0.1, "Jitter: uniform [0, ratio × delay)")
    lock_ttl_seconds: float = option(
        6 * 60, "TTL of the run's distributed lock, renewed every third of it while it works"
    )
    # Also the HTTP connection pool size.
    max_concurrency: int = option(8, "Selections calls in flight at once")

    def validate(self) -> None:
        rules: list[tuple[str, bool, str]] = [
            ("batch_size", self.batch_size > 0, "must be > 0"),
            ("max_run_duration_seconds", self.max_run_duration_seconds > 0, "must be > 0"),
            ("max_attempts", self.max_attempts > 0, "must be > 0"),
            ("backoff_base_seconds", self.backoff_base_seconds > 0, "must be > 0"),
            ("backoff_factor", self.backoff_factor >= 1, "must be >= 1"),
            (
                "backoff_cap_seconds",
                self.backoff_cap_seconds >= self.backoff_base_seconds,
                "must be >= backoff_base_seconds",
            ),
            ("backoff_jitter_ratio", 0 <= self.backoff_jitter_ratio <= 1, "must be in [0, 1]"),
            ("lock_ttl_seconds", self.lock_ttl_seconds > 0, "must be > 0"),
            ("max_concurrency", self.max_concurrency > 0, "must be > 0"),
        ]
        defaults = {f.name: f.default for f in fields(DetachOptions)}
        problems = [
            f"{name} {rule} (got {getattr(self, name)!r}; default is {defaults[name]!r})"
            for name, ok, rule in rules
            if not ok
        ]
        if problems:
            raise SnapshotDetachConfigError(
                "invalid news-snapshot-detach-retry config: " + "; ".join(problems)
            )


def backoff_seconds(
    attempts: int,
    *,
    base: float,
    factor: float,
    cap: float,
    jitter_ratio: float,
    rand: RandomSource = random.random,
) -> float:
    """min(base · factor^(attempts−1), cap) + jitter, jitter uniform in [0, ratio × delay)."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1 (got {attempts})")
    # factor^(n-1) overflows a float for a large n long after it passed the cap.
    exponent = attempts - 1
    delay = cap if exponent > 1000 else min(base * factor**exponent, cap)
    return delay + jitter_ratio * delay * rand()


def retry_delay_seconds(
    attempts: int, options: DetachOptions, rand: RandomSource = random.random
) -> float:
    """How long after attempt `attempts` failed attempt `attempts + 1` falls due."""
    return backoff_seconds(
        attempts,
        base=options.backoff_base_seconds,
        factor=options.backoff_factor,
        cap=options.backoff_cap_seconds,
        jitter_ratio=options.backoff_jitter_ratio,
        rand=rand,
    )


def claim_lease_seconds(
    attempts: int,
    options: DetachOptions,
    call_timeout_seconds: float,
    rand: RandomSource = random.random,
) -> float:
    """How long a claim keeps the row from being due (from the database's now()): the
    longest its call may still be in flight, then the backoff. Nobody can claim the row
    while its call may still be in flight, and a run that dies mid-call leaves it to be
    retried after the backoff, as a failure would."""
    return call_timeout_seconds + retry_delay_seconds(attempts, options, rand)


@dataclass(frozen=True)
class ClaimedEntry:
    id: uuid.UUID
    snapshot_id: uuid.UUID
    post_id: uuid.UUID
    reason: str
    # The claim stamp: what the row carries after this claim, its optimistic version.
    attempts: int
    next_attempt_at: datetime
    # What it carried before, to give the attempt back if the call never started.
    previous_attempts: int
    previous_next_attempt_at: datetime


@dataclass(frozen=True)
class Outcome:
    entry: ClaimedEntry
    status: Status
    call: CallResult
    # Pending: seconds from when the outcome is written to the next attempt — the backoff
    # counted from the end of the failed call (the database adds them to its now()).
    retry_after_seconds: float | None = None

    @property
    def last_error(self) -> str | None:
        if self.status == Status.DONE:
            return None
        return f"{self.call.kind.value}:{self.call.code}"[:LAST_ERROR_MAX]


def decide(
    entry: ClaimedEntry,
    call: CallResult,
    options: DetachOptions,
    rand: RandomSource = random.random,
    *,
    since_call_ended_seconds: float = 0.0,
) -> Outcome:
    """What the answer does to the row; a retry's delay is the backoff less the time since
    the call ended (a monotonic duration: no wall clock involved)."""
    if call.kind == CallKind.DETACHED:
        return Outcome(entry, Status.DONE, call)
    if entry.attempts >= options.max_attempts:
        return Outcome(entry, Status.QUARANTINED, call)
    delay = retry_delay_seconds(entry.attempts, options, rand) - since_call_ended_seconds
    return Outcome(entry, Status.PENDING, call, max(delay, 0.0))
