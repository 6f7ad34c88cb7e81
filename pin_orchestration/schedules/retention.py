"""`pin_retention`: at 02:30 Moscow, the daily batch delete of old rows (job `pin_retention`,
jobs/retention.py)."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from pin_orchestration.coordination.retention import RETENTION_JOB
from pin_orchestration.jobs.retention import pin_retention_job

pin_retention = ScheduleDefinition(
    # Named as its job is (both are operators' contracts).
    name=RETENTION_JOB.name,
    job=pin_retention_job,
    cron_schedule="30 2 * * *",
    execution_timezone="Europe/Moscow",
    default_status=DefaultScheduleStatus.RUNNING,
    description="02:30 Moscow: delete rows older than their configured ages, in batches",
)
