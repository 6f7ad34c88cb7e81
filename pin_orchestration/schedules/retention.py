"""The daily schedule of pin-retention."""

from __future__ import annotations

from dagster import DefaultScheduleStatus, ScheduleDefinition

from pin_orchestration.jobs.retention import pin_retention_job

pin_retention = ScheduleDefinition(
    name="pin_retention",
    job=pin_retention_job,
    cron_schedule="30 2 * * *",
    execution_timezone="Europe/Moscow",
    default_status=DefaultScheduleStatus.RUNNING,
    description="02:30 Moscow: delete rows older than their configured ages, in batches",
)
