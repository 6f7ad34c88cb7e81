"""`chessboard_project_recalc_sensor`: watches chessboard.project_recalc_requests and
launches drain runs — never one run per project (a run costs seconds; a drain run takes
rows with FOR UPDATE SKIP LOCKED and logs one materialization per project)."""
# No `from __future__ import annotations`: Dagster reads resource types from the
# annotations at definition time.

import math
from datetime import UTC, datetime

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from pin_orchestration.chessboard.queue import DEFAULT_POLICY, queue_stats
from pin_orchestration.jobs.chessboard import DRAIN_TAGS, chessboard_project_recalc_drain
from pin_orchestration.resources.database import DatabaseResource

# Drain runs in flight at once (dagster.yaml's pin/drain tag limit enforces the same cap
# at launch; counting here keeps the sensor from piling runs into the queue).
MAX_CONCURRENT_DRAIN_RUNS = 2
IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]


@sensor(
    name="chessboard_project_recalc_sensor",
    job=chessboard_project_recalc_drain,
    minimum_interval_seconds=5,
    default_status=DefaultSensorStatus.RUNNING,
    description="Every 5 s: if project recalc requests are due, launch drain runs (one per "
    "50 due rows, at most 2 in flight). Evaluation is one count/min(due_at) query.",
)
def chessboard_project_recalc_sensor(
    context: SensorEvaluationContext, database: DatabaseResource
) -> SensorResult | SkipReason:
    with database.get_engine().connect() as conn:
        stats = queue_stats(conn)
    if stats.due == 0:
        next_due = stats.next_due_at.isoformat() if stats.next_due_at else "none queued"
        return SkipReason(
            f"no due recalc requests (depth {stats.depth}, poison {stats.poison}, "
            f"next due {next_due})"
        )
    in_flight = context.instance.get_runs_count(
        RunsFilter(job_name=chessboard_project_recalc_drain.name, statuses=IN_FLIGHT)
    )
    wanted = min(
        MAX_CONCURRENT_DRAIN_RUNS - in_flight, math.ceil(stats.due / DEFAULT_POLICY.batch_size)
    )
    if wanted <= 0:
        return SkipReason(f"{stats.due} due, {in_flight} drain run(s) already in flight")
    tick = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")
    return SensorResult(
        run_requests=[
            RunRequest(
                run_key=f"drain-{tick}-{slot}",
                tags={**DRAIN_TAGS, "pin/due_rows": str(stats.due)},
            )
            for slot in range(wanted)
        ]
    )
