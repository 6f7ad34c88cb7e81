"""The record of each background-job run in pin.job_runs.

Runs are short-lived processes, so what alerts and metrics need to know about past runs
("no successful run in 26 h", totals of corrected drift) is kept here, durably.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, text


class RunStatus(StrEnum):
    """The statuses pin.job_runs accepts (its CHECK constraint)."""

    SUCCEEDED = "succeeded"
    SKIPPED = "skipped"  # the lock was held by another runner
    CANCELLED = "cancelled"
    FAILED = "failed"


# Bounds (ms) of the run-duration histograms, also what pin-retention retires into.
RUN_DURATION_BUCKETS_MS = (100, 500, 1_000, 5_000, 30_000, 60_000, 300_000, 1_200_000)

_INSERT = text(
    """
    INSERT INTO pin.job_runs (job_code, run_id, status, started_at, finished_at, result)
    VALUES (:job_code, :run_id, :status, :started_at, now(), CAST(:result AS jsonb))
    """
)
# At most one 'failed' row per run: the run's own record (a run that caught its failure)
# or the run-failure sensor's, whichever comes first; a replayed sensor tick adds nothing.
_INSERT_FAILED_ONCE = text(
    """
    INSERT INTO pin.job_runs (job_code, run_id, status, started_at, finished_at, result)
    SELECT :job_code, :run_id, 'failed', :started_at, now(), CAST(:result AS jsonb)
    WHERE NOT EXISTS (
        SELECT 1 FROM pin.job_runs
        WHERE job_code = :job_code AND run_id = :run_id AND status = 'failed'
    )
    """
)
_LAST_SUCCESS = text(
    """
    SELECT max(finished_at) FROM pin.job_runs
    WHERE job_code = :job_code AND status = 'succeeded'
    """
)
_COUNT_SINCE = text(
    """
    SELECT count(*) FROM pin.job_runs
    WHERE job_code = :job_code AND status = :status
      AND finished_at >= now() - make_interval(secs => :seconds)
    """
)


def record_job_run(
    engine: Engine,
    *,
    job_code: str,
    run_id: str,
    status: str,
    started_at: datetime,
    result: dict[str, Any],
) -> None:
    with engine.begin() as conn:
        conn.execute(
            _INSERT,
            {
                "job_code": job_code,
                "run_id": run_id,
                "status": status,
                "started_at": started_at,
                "result": json.dumps(result, default=str),
            },
        )


def record_failed_run(
    engine: Engine, *, job_code: str, run_id: str, started_at: datetime, error: str
) -> bool:
    """Count a failed run once, however often it is reported; True if this call counted it."""
    with engine.begin() as conn:
        inserted = conn.execute(
            _INSERT_FAILED_ONCE,
            {
                "job_code": job_code,
                "run_id": run_id,
                "started_at": started_at,
                "result": json.dumps({"error": error}),
            },
        ).rowcount
    return inserted == 1


def last_successful_run_at(engine: Engine, job_code: str) -> datetime | None:
    with engine.connect() as conn:
        return conn.execute(_LAST_SUCCESS, {"job_code": job_code}).scalar()


def count_runs_since(engine: Engine, job_code: str, status: str, seconds: float) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                _COUNT_SINCE, {"job_code": job_code, "status": status, "seconds": seconds}
            ).scalar_one()
        )
