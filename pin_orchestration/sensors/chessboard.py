"""`chessboard_project_recalc_sensor`: watches chessboard.project_recalc_requests and
launches drain runs of `chessboard_project_recalc_drain` (jobs/chessboard.py) — never one
run per project (a run costs seconds; a drain run takes many rows).

A drain run stays up to its max duration, waking as rows fall due, so the sensor's job is
to keep runs alive while there is work: one per 50 due rows up to the cap, and — when
nothing is due yet but a row falls due before the next evaluation — one run started ahead
of it (it sleeps until the row is due). Launching ahead keeps the first row after a quiet
spell from waiting for a tick + run launch, and a second live run covers the gap when the
other reaches its max duration. Each evaluation is one count/min(due_at) query
(`chessboard.queue.queue_stats`)."""

import math

from dagster import DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from pin_orchestration.chessboard.queue import DEFAULT_POLICY, queue_stats
from pin_orchestration.jobs.chessboard import DRAIN_TAGS, chessboard_project_recalc_drain
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.sensors.drain_runs import drain_run_requests, runs_in_flight

# Drain runs in flight at once (dagster.yaml's pin/drain tag limit enforces the same cap
# at launch; counting here keeps the sensor from piling runs into the queue).
MAX_CONCURRENT_DRAIN_RUNS = 2
SENSOR_INTERVAL_SECONDS = 5
# A row falling due within this is worth a run now: it would otherwise wait for the next
# evaluation and then for the run to start.
LAUNCH_AHEAD_SECONDS = SENSOR_INTERVAL_SECONDS


def drain_runs_wanted(
    due: int, seconds_until_next_due: float | None, in_flight: int, batch_size: int
) -> int:
    """How many drain runs to launch now: one per `batch_size` due rows, or one ahead of a
    row that falls due before the next evaluation — never beyond the cap in flight."""
    free = MAX_CONCURRENT_DRAIN_RUNS - in_flight
    if due > 0:
        return max(0, min(free, math.ceil(due / batch_size)))
    if seconds_until_next_due is not None and seconds_until_next_due <= LAUNCH_AHEAD_SECONDS:
        return max(0, min(free, 1))
    return 0


@sensor(
    name="chessboard_project_recalc_sensor",
    job=chessboard_project_recalc_drain,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description="Every 5 s: if project recalc requests are due (or fall due within 5 s), "
    "launch drain runs (one per 50 due rows, at most 2 in flight); a run keeps draining as "
    "rows fall due for up to its max duration. Evaluation is one count/min(due_at) query.",
)
def chessboard_project_recalc_sensor(
    context: SensorEvaluationContext, database: DatabaseResource
) -> SensorResult | SkipReason:
    with database.get_engine().connect() as conn:
        stats = queue_stats(conn)
    until_due = stats.next_due_in_seconds
    if stats.due == 0 and (until_due is None or until_due > LAUNCH_AHEAD_SECONDS):
        next_due = stats.next_due_at.isoformat() if stats.next_due_at else "none queued"
        return SkipReason(
            f"no due recalc requests (depth {stats.depth}, poison {stats.poison}, "
            f"next due {next_due})"
        )
    in_flight = runs_in_flight(context.instance, chessboard_project_recalc_drain.name)
    wanted = drain_runs_wanted(stats.due, until_due, in_flight, DEFAULT_POLICY.batch_size)
    if wanted <= 0:
        return SkipReason(f"{stats.due} due, {in_flight} drain run(s) already in flight")
    return drain_run_requests("drain", wanted, {**DRAIN_TAGS, "pin/due_rows": str(stats.due)})
