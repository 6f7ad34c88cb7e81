"""Counting a job's runs that hold or wait for a slot, for the sensors that size drain runs
(jobs/chessboard.py, jobs/scraping.py)."""

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

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
