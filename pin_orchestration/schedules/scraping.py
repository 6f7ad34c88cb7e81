"""`scraping_stuck_sweeper`: every minute, `scraping_sweep_expired_leases` (jobs/scraping.py)
puts running jobs whose lease expired back to queued (SCR-5)."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from pin_orchestration.jobs.scraping import scraping_sweep_expired_leases

scraping_stuck_sweeper = ScheduleDefinition(
    name="scraping_stuck_sweeper",
    job=scraping_sweep_expired_leases,
    cron_schedule="* * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Every minute: running jobs whose lease expired go back to queued (SCR-5).",
)
