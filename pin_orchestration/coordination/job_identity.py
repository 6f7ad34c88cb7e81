"""A job's identity: its Dagster job name, declared once beside the code the job runs, and
every other name of the job derived from it — its job code (pin.job_runs, logs, the
`pin/job` tag), its lock key, and how record_failed_runs knows its runs.

The seeds spell a job three ways (`news_snapshot_detach_retry` in Dagster,
`news-snapshot-detach-retry` in the record, `Pin:lock:job:scheduled:news-snapshot-detach-
retry` for the lock); operators rely on all three, so they are derived here, never spelled
again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pin_orchestration.coordination.locks import SCHEDULED_JOB_LOCK_PREFIX

# The run tag that names the job a run records under (record_failed_runs reads it).
JOB_CODE_TAG = "pin/job"


@dataclass(frozen=True)
class JobIdentity:
    name: str
    """The Dagster job name: snake_case, starting with its area (tests/test_definitions.py)."""
    records_runs: bool = True
    """The job records each run in pin.job_runs under its job code, under its lock, and
    tags its runs with the code. A job that does not (a drain run sized by a sensor) is
    known there only by the failed runs record_failed_runs counts, under its Dagster name."""
    asset: tuple[str, ...] = ()
    """The key (path) of the asset the job materializes, for an asset job: a run of that
    asset launched outside the job (a backfill from the asset page) is the job's run too."""

    @property
    def code(self) -> str:
        """The job code: the Dagster name in kebab-case (`news-comment-reconcile`), or the
        Dagster name itself for a job that records no runs of its own."""
        return self.name.replace("_", "-") if self.records_runs else self.name

    @property
    def lock_key(self) -> str:
        """The lock one run at a time holds (`Pin:lock:job:scheduled:<code>`)."""
        return SCHEDULED_JOB_LOCK_PREFIX + self.code

    @property
    def tags(self) -> dict[str, str]:
        """The job's run tags: its code, so a failed run is counted under it."""
        return {JOB_CODE_TAG: self.code} if self.records_runs else {}

    @property
    def asset_key(self) -> str:
        """The asset's key as a run's asset selection spells it (`news/post_comment_counts`)."""
        return "/".join(self.asset)
