"""pin-retention: delete, in batches, what is older than its configured age and no longer
needed — Done snapshot-detach intents, published chessboard events, old job runs, stored
scraping results — keeping whatever a metric or a check still reads.

A kind of row is one `RetentionKind`: a named batch-delete statement in retention.sql
(oldest first, SKIP LOCKED, one transaction per batch, retiring what the rows contributed
to counters into pin.retired_totals) and the option holding its age in days. Adding a
kind is adding a statement, an option and an entry in `KINDS`. What the areas own — the
bucket bounds of their histograms, the scraping results store and its default age — they
hand in as `RetentionRules` (pin_orchestration/areas.py lists them): this module imports
no area.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Engine

from pin_orchestration.coordination.job_identity import JobIdentity
from pin_orchestration.coordination.jobruns import (
    RUN_DURATION_BUCKETS_MS,
    RunStatus,
    record_job_run,
)
from pin_orchestration.coordination.locks import renewed_lock
from pin_orchestration.platform.options import option
from pin_orchestration.platform.sql import NamedQueries

RETENTION_JOB = JobIdentity("pin_retention")

log = logging.getLogger(__name__)


class RetentionConfigError(ValueError):
    """The run's options are invalid; raised before any work is done."""


@dataclass(frozen=True)
class RetentionOptions:
    snapshot_detach_done_days: float = option(
        30, "Delete Done news.snapshot_detach_outbox rows this many days after they were done"
    )
    chessboard_published_days: float = option(
        30, "Delete chessboard.event_outbox rows this many days after they were published"
    )
    job_runs_days: float = option(
        90,
        "Delete pin.job_runs rows this many days after they finished (the newest run "
        "and the newest successful run of each job stay)",
    )
    scraping_results_days: float | None = option(
        None,
        "Delete stored scraping results (S3 or local) this many days after their job "
        "finished, marking the jobs' results expired (GET /jobs/{id}/result: 410); "
        "empty → PIN_RESULT_RETENTION_DAYS (default 30)",
    )
    scraping_attempt_objects_days: float = option(
        2,
        "Delete the stored objects a scraping job ended without (attempts other than the "
        "one it reports: lost to a lease race, cut by a killed worker, or of a job that "
        "failed or was cancelled) this many days after it finished",
    )
    batch_size: int = option(5000, "Rows per delete (one transaction each)")
    max_run_duration_seconds: float = option(
        30 * 60, "Stop after this long; the next run deletes the rest"
    )
    lock_ttl_seconds: float = option(
        5 * 60, "TTL of the distributed lock, renewed every third of it while the run works"
    )

    def validate(self) -> None:
        problems = [
            f"{name} must be >= 2 days, so the checks' 26 h look-back keeps its rows "
            f"(got {getattr(self, name)})"
            for name in (k.days_option for k in KINDS)
            if getattr(self, name) is not None and getattr(self, name) < 2
        ]
        for name in ("batch_size", "max_run_duration_seconds", "lock_ttl_seconds"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0 (got {getattr(self, name)})")
        if problems:
            raise RetentionConfigError("invalid pin-retention config: " + "; ".join(problems))

    def resolved(self, rules: RetentionRules) -> RetentionOptions:
        """The options with an empty scraping_results_days read from the environment."""
        if self.scraping_results_days is not None:
            return self
        return replace(self, scraping_results_days=rules.scraping_results_days())


class ObjectStore(Protocol):
    """What retention needs of the scraping results store (scraping/store/results.py)."""

    def delete_many(self, keys: Sequence[str]) -> int: ...


# Builds the results store when a batch first has objects to delete (not before: a run
# with nothing expired needs no S3 client).
StoreProvider = Callable[[], ObjectStore]


@dataclass(frozen=True)
class RetentionRules:
    """What the areas hand pin-retention: read by the statements, owned by an area."""

    # Bucket bounds, by the statements' parameter, of the histograms whose counts a
    # statement retires (those the metrics expose): news_snapshot_detach_lag_seconds'.
    histogram_bounds: Mapping[str, Sequence[float]]
    result_store: StoreProvider
    # The age of stored scraping results when the option is empty (PIN_RESULT_RETENTION_DAYS).
    scraping_results_days: Callable[[], float]


@dataclass(frozen=True)
class RetentionKind:
    name: str  # the query in retention.sql, and the key of its count in the result
    days_option: str  # the RetentionOptions field with its age
    # The statement returns the keys of stored objects (result_key) to delete from the
    # results store in its transaction, instead of a count of deleted rows.
    deletes_stored_objects: bool = False

    def params(self, rules: RetentionRules) -> dict[str, Any]:
        """Bucket bounds the statement retires histogram counts into (those the metrics
        expose), so the statement itself stays free of Python constants."""
        bounds = {**rules.histogram_bounds, "duration_bounds": RUN_DURATION_BUCKETS_MS}
        return {name: [float(b) for b in values] for name, values in bounds.items()}


KINDS: tuple[RetentionKind, ...] = (
    RetentionKind("snapshot_detach_done", "snapshot_detach_done_days"),
    RetentionKind("chessboard_published_events", "chessboard_published_days"),
    RetentionKind("job_runs", "job_runs_days"),
    RetentionKind("scraping_results", "scraping_results_days", deletes_stored_objects=True),
    RetentionKind(
        "scraping_attempt_objects", "scraping_attempt_objects_days", deletes_stored_objects=True
    ),
)


@dataclass
class RetentionResult:
    status: RunStatus = RunStatus.SUCCEEDED
    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    backlog_remaining: bool = False
    duration_ms: int = 0
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


_query = NamedQueries("pin_orchestration.coordination", "retention.sql")


def delete_batch(
    engine: Engine,
    kind: RetentionKind,
    cutoff: datetime,
    batch_size: int,
    rules: RetentionRules,
) -> int:
    """Delete up to batch_size rows (or stored objects) of `kind` older than `cutoff`; one
    transaction. Stored objects are deleted from the store before the transaction that
    marks them commits: a failed store delete marks nothing, and a commit lost after the
    delete only repeats it (deleting a missing key is no error)."""
    params = {"cutoff": cutoff, "batch_size": batch_size, **kind.params(rules)}
    with engine.begin() as conn:
        answer = conn.execute(_query(kind.name), params)
        if not kind.deletes_stored_objects:
            return int(answer.scalar_one())
        keys = list(answer.scalars())
        if keys:
            rules.result_store().delete_many(keys)
        return len(keys)


def run_retention(
    engine: Engine,
    options: RetentionOptions,
    rules: RetentionRules,
    *,
    run_id: str,
    holder: str,
    now: datetime | None = None,
    stop_requested: threading.Event | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> RetentionResult:
    """One run under the distributed lock (renewed while it works): each kind in turn,
    batch after batch, until nothing older than its age is left, the run's time is up,
    a stop is requested or the lock is lost."""
    options = options.resolved(rules)
    options.validate()
    rules = replace(rules, result_store=_once(rules.result_store))
    started_at = datetime.now(UTC)
    started = time.monotonic()
    now = now or started_at
    result = RetentionResult()
    with renewed_lock(engine, RETENTION_JOB.lock_key, options.lock_ttl_seconds, holder) as lease:
        if not lease.acquired:
            logger.info(
                "%s skipped, lock held (key=%s)", RETENTION_JOB.code, RETENTION_JOB.lock_key
            )
            result.status = RunStatus.SKIPPED
        else:
            try:
                _delete_all(
                    engine, options, now, started, stop_requested, lease.lost, result, rules
                )
            except Exception as exc:  # noqa: BLE001 — recorded, then re-raised
                result.status = RunStatus.FAILED
                result.error = f"{type(exc).__name__}: {exc}"[:512]
                result.backlog_remaining = True
                logger.exception("%s failed; the batches before stay deleted", RETENTION_JOB.code)
            if lease.lost.is_set():
                result.status = RunStatus.FAILED
                result.error = f"lost the lock {RETENTION_JOB.lock_key}; stopped"
        result.duration_ms = int((time.monotonic() - started) * 1000)
        record_job_run(
            engine,
            job_code=RETENTION_JOB.code,
            run_id=run_id,
            status=result.status.value,
            started_at=started_at,
            result=result.summary(),
        )
    logger.info(
        "%s %s: deleted=%s batches=%d backlogRemaining=%s",
        RETENTION_JOB.code,
        result.status.value,
        result.deleted,
        result.batches,
        result.backlog_remaining,
    )
    return result


def _delete_all(
    engine: Engine,
    options: RetentionOptions,
    now: datetime,
    started: float,
    stop_requested: threading.Event | None,
    lost: threading.Event,
    result: RetentionResult,
    rules: RetentionRules,
) -> None:
    for kind in KINDS:
        cutoff = now - timedelta(days=getattr(options, kind.days_option))
        result.deleted[kind.name] = 0
        while True:
            if lost.is_set() or (stop_requested is not None and stop_requested.is_set()):
                result.backlog_remaining = True
                if not lost.is_set():
                    result.status = RunStatus.CANCELLED
                return
            deleted = delete_batch(engine, kind, cutoff, options.batch_size, rules)
            result.deleted[kind.name] += deleted
            result.batches += 1
            if deleted < options.batch_size:
                break
            if time.monotonic() - started >= options.max_run_duration_seconds:
                result.backlog_remaining = True
                return


def _once(provider: StoreProvider) -> StoreProvider:
    built: list[ObjectStore] = []

    def get() -> ObjectStore:
        if not built:
            built.append(provider())
        return built[0]

    return get
