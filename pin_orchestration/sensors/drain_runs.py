"""What the sensors that size drain runs share (sensors/chessboard.py,
sensors/scraping.py): how many of a job's runs hold or wait for a slot, and the run
requests a tick returns."""

from collections.abc import Mapping
from datetime import UTC, datetime

from dagster import DagsterInstance, DagsterRunStatus, RunRequest, RunsFilter, SensorResult

# Every status in which a run holds (or waits for) a slot; a CANCELING run is still
# finishing its current unit of work.
IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def runs_in_flight(instance: DagsterInstance, job_name: str) -> int:
    return instance.get_runs_count(RunsFilter(job_name=job_name, statuses=IN_FLIGHT))


def drain_run_requests(
    key_prefix: str, count: int, tags: Mapping[str, str], *, numbered: bool = True
) -> SensorResult:
    """`count` drain runs, keyed `<prefix>-<tick time>-<slot>` (no slot when not
    `numbered`): a run_key blocks its reuse forever, so each tick's keys are new."""
    tick = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")
    keys = (
        [f"{key_prefix}-{tick}-{slot}" for slot in range(count)]
        if numbered
        else [f"{key_prefix}-{tick}"]
    )
    return SensorResult(run_requests=[RunRequest(run_key=key, tags=dict(tags)) for key in keys])
